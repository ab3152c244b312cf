package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/inbox"
)

// DefaultInboxKeepAlive is how often an idle approvals event stream gets a
// keep-alive comment.
const DefaultInboxKeepAlive = 15 * time.Second

// inboxPage is how many events one read of the log takes.
const inboxPage = 100

// inboxRoutes serves the approvals inbox's live events (issue 14).
func (s *Server) inboxRoutes() {
	if s.svc.Inbox == nil {
		return
	}
	s.route(http.MethodGet, "/v1/approvals/events", s.approvalEvents, []string{RoleApprover},
		refuseBoundTokens("the approvals inbox is for people who answer approvals, not agents"))
}

// eventsSeq is the org's approvals event seq for a list's events_seq: read
// before the list's rows, so the page reflects at least every event up to
// it (0 without an inbox). A token bound to an agent gets 0: it may not
// subscribe to the events, and the org's seq counts every agent's
// requests, which it must not see.
func (s *Server) eventsSeq(c echo.Context) (int64, error) {
	if s.svc.Inbox == nil || PrincipalFrom(c).AgentID != "" {
		return 0, nil
	}
	return s.svc.Inbox.Seq(c.Request().Context(), s.svc.DB, PrincipalFrom(c).OrgID)
}

// approvalEvents streams the org's approvals events as Server-Sent Events:
// those after Last-Event-ID (or ?after=; the header wins; neither: only
// new ones), then each as it commits, with keep-alive comments while idle.
// It starts with the seq it resumes after as an id: alone, or on a `reset`
// event when the resume point was older than what retention kept, or past
// the log's end. The subscription is taken before the first read and before the
// response starts, so nothing committed after the client sees the headers
// is missed.
func (s *Server) approvalEvents(c echo.Context) error {
	after, given, err := inboxResumePoint(c)
	if err != nil {
		return err
	}
	org := PrincipalFrom(c).OrgID
	ctx := c.Request().Context()
	release, err := s.streamCap.acquire(org)
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.svc.Inbox.Subscribe(org)
	if err != nil {
		return stoppingProblem("the approvals event stream is")
	}
	defer sub.Close()
	oldest, last, err := s.svc.Inbox.Window(ctx, org)
	if err != nil {
		return err
	}
	reset := false
	switch {
	case !given:
		after = last
	case after < oldest-1:
		after, reset = oldest-1, true
	case after > last:
		// (a seq this log never reached: from a restored database or another
		// deployment; waiting for it would hide every event until then)
		after, reset = last, true
	}
	// The stream first says where it stands, as an SSE id: the reset's, or
	// an id alone (no event is dispatched for it, but the client's last
	// event ID takes it). A client that started at the end or was reset
	// and is cut before the next event then resumes from here, not from
	// the end as of its reconnect, which would skip what came between.
	var buf []byte
	if reset {
		buf = fmt.Appendf(buf, "id: %d\nevent: reset\ndata: {\"seq\":%d}\n\n", after, after)
	} else {
		buf = fmt.Appendf(buf, "id: %d\n\n", after)
	}
	res := c.Response()
	res.Header().Set(echo.HeaderContentType, "text/event-stream")
	res.Header().Set(echo.HeaderCacheControl, "no-cache")
	res.Header().Set("X-Accel-Buffering", "no") // proxies must not hold events back
	res.WriteHeader(http.StatusOK)

	keepAlive := time.NewTicker(s.cfg.InboxKeepAlive)
	defer keepAlive.Stop()
	expired, stop := tokenExpiry(c)
	defer stop()
	for {
		events, err := s.svc.Inbox.After(ctx, org, after, inboxPage)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("approvals event stream read failed; closing the connection", "error", err.Error(), "org_id", org)
			}
			return nil // the client resumes with Last-Event-ID
		}
		if buf, err = appendInboxEvents(buf, after, events); err != nil {
			return err
		}
		// The first send flushes the headers.
		if err := s.sseSend(c, buf); err != nil {
			return nil // the client left
		}
		buf = buf[:0]
		if len(events) > 0 {
			after = events[len(events)-1].Seq
		}
		if len(events) == inboxPage {
			if s.tokenExpiredNow(c, expired) {
				return nil
			}
			select {
			case <-sub.Done(): // the hub stops: a reader catching up ends too
				return nil
			default:
			}
			continue // more may be stored already
		}
		if !s.awaitInbox(c, sub, keepAlive, expired) {
			return nil
		}
	}
}

// awaitInbox waits until the org's log may have grown, writing keep-alive
// comments meanwhile; each keep-alive also rereads, so a notification lost
// with a LISTEN connection delays a reader at most that long. It reports
// false when the client left, the server is stopping or the token expired.
func (s *Server) awaitInbox(c echo.Context, sub *inbox.Subscription, keepAlive *time.Ticker, expired <-chan time.Time) bool {
	select {
	case <-sub.Ready():
		return true
	case <-expired:
		_ = s.sseSend(c, []byte(tokenExpiredComment))
		return false
	case <-c.Request().Context().Done():
		return false
	case <-sub.Done():
		return false
	case <-keepAlive.C:
		return s.sseSend(c, []byte(": keep-alive\n\n")) == nil
	}
}

// appendInboxEvents appends events, read after seq after, to buf as SSE.
// An org's seqs have no gaps and commit in order, so a hole before an
// event was purged by retention (which purges by the time an append's
// transaction began, not by seq, in batches committed one by one, and may
// purge between this stream's reads): it is said with a reset to the seq
// before the event, as at a start, never skipped in silence.
func appendInboxEvents(buf []byte, after int64, events []inbox.Event) ([]byte, error) {
	for _, ev := range events {
		if ev.Seq != after+1 {
			buf = fmt.Appendf(buf, "id: %d\nevent: reset\ndata: {\"seq\":%d}\n\n", ev.Seq-1, ev.Seq-1)
		}
		ev.At = ev.At.UTC() // (as every answer's times: read from Postgres, it is in the replica's zone)
		data, err := json.Marshal(ev)
		if err != nil {
			return buf, fmt.Errorf("encoding approval event %d: %w", ev.Seq, err)
		}
		buf = fmt.Appendf(buf, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, data)
		after = ev.Seq
	}
	return buf, nil
}

// inboxResumePoint reads the seq to resume after: Last-Event-ID, else
// ?after=; given is false when neither is set.
func inboxResumePoint(c echo.Context) (after int64, given bool, err error) {
	field, raw := "Last-Event-ID", c.Request().Header.Get("Last-Event-ID")
	if raw == "" {
		field, raw = "after", c.QueryParam("after")
	}
	if raw == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		return 0, false, Invalid(field, "must be an approvals event seq (an integer ≥ 0)")
	}
	return n, true, nil
}
