package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/streams"
)

// withInbox adds the approvals event log (its hub started) and the
// mandates and tool approvals services appending to it (their sweepers not
// started: tests call Sweep).
func withInbox(t *testing.T, keepAlive time.Duration) func(*Config, *Services) {
	return func(c *Config, sv *Services) {
		sv.Inbox = inbox.New(sv.DB, inbox.Config{Logger: testkit.Logger(t)})
		require.NoError(t, sv.Inbox.Start(context.Background()))
		t.Cleanup(func() { require.NoError(t, sv.Inbox.Stop(context.Background())) })
		sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t), Inbox: sv.Inbox})
		sv.Approvals = approvals.New(sv.DB, approvals.Config{Logger: testkit.Logger(t), Inbox: sv.Inbox})
		c.InboxKeepAlive = keepAlive
	}
}

// inboxFixture is a live server (SSE needs a real connection) with the
// inbox, and tokens of two orgs.
type inboxFixture struct {
	srv                    *httptest.Server
	s                      *Server
	agent, alice, bob      string
	otherAgent, otherAlice string
	adminOnly, agentOnly   string
	boundApprover          string
}

func newInboxFixture(t *testing.T, keepAlive time.Duration) inboxFixture {
	t.Helper()
	s := newTestServer(t, withInbox(t, keepAlive))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return inboxFixture{srv: srv, s: s,
		agent:         subToken(t, "org-a", "runtime", "", RoleAgent),
		alice:         subToken(t, "org-a", "alice", "", RoleApprover),
		bob:           subToken(t, "org-a", "bob", "", RoleApprover),
		otherAgent:    subToken(t, "org-b", "runtime", "", RoleAgent),
		otherAlice:    subToken(t, "org-b", "alice", "", RoleApprover),
		adminOnly:     subToken(t, "org-a", "root", "", RoleAdmin),
		agentOnly:     subToken(t, "org-a", "runtime2", "", RoleAgent, RoleAdmin),
		boundApprover: subToken(t, "org-a", "carol", "agent-1", RoleApprover),
	}
}

// pendingToolCall makes a tool call in session that waits for a human and
// returns its approval id.
func (f inboxFixture) pendingToolCall(t *testing.T, tok, session string) string {
	t.Helper()
	r := do(t, f.s.Handler(), http.MethodPost, "/v1/sessions/"+session+"/tool-calls", tok,
		map[string]any{"agent_id": "agent-1", "tool_name": "send_email", "input": map[string]any{"to": "x@example.com"}})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, "pending", r.JSON(t)["decision"])
	return r.JSON(t)["approval_id"].(string)
}

// overrun makes a spend without a mandate and returns the approval id of
// its request.
func (f inboxFixture) overrun(t *testing.T, tok string, cost int) string {
	t.Helper()
	r := do(t, f.s.Handler(), http.MethodPost, "/v1/mandates/spend", tok, map[string]any{"agent_id": "agent-1", "scope": "llm", "cost": cost})
	require.Equal(t, http.StatusPaymentRequired, r.Status, "body: %s", r.Body)
	return r.JSON(t)["approval_id"].(string)
}

// inboxSSE is one parsed event or comment of a stream.
type inboxSSE struct {
	ID, Event, Data string
	Comment         string
}

// inboxSSEReader reads a live approvals event stream.
type inboxSSEReader struct {
	resp   *http.Response
	events chan inboxSSE
}

func (f inboxFixture) subscribe(t *testing.T, tok string, headers ...string) *inboxSSEReader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/v1/approvals/events"+query(headers), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] != "?" {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r := &inboxSSEReader{resp: resp, events: make(chan inboxSSE, 1000)}
	t.Cleanup(func() { cancel(); _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		return r
	}
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	go func() {
		defer close(r.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev inboxSSE
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev != (inboxSSE{}) {
					r.events <- ev
				}
				ev = inboxSSE{}
			case strings.HasPrefix(line, ":"):
				ev.Comment = strings.TrimSpace(line[1:])
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.Data = line[6:]
			}
		}
	}()
	return r
}

// query turns a "?" pseudo-header into the query string.
func query(headers []string) string {
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "?" {
			return "?" + headers[i+1]
		}
	}
	return ""
}

// next returns the next event, skipping comments and ids alone (the
// stream's position: no event).
func (r *inboxSSEReader) next(t *testing.T) inboxSSE {
	t.Helper()
	for {
		if ev := r.nextBlock(t); ev.Event != "" || ev.Data != "" {
			return ev
		}
	}
}

// nextBlock returns what came up to the next blank line: an event, a
// comment or an id alone.
func (r *inboxSSEReader) nextBlock(t *testing.T) inboxSSE {
	t.Helper()
	select {
	case ev, ok := <-r.events:
		require.True(t, ok, "the stream ended")
		return ev
	case <-time.After(10 * time.Second):
		require.FailNow(t, "nothing within 10 s")
		return inboxSSE{}
	}
}

// approvalEvent is an event's data.
type approvalEvent struct {
	Seq        int64          `json:"seq"`
	Type       string         `json:"type"`
	Kind       string         `json:"kind"`
	ApprovalID string         `json:"approval_id"`
	Approval   map[string]any `json:"approval"`
	At         time.Time      `json:"at"`
}

func (r *inboxSSEReader) nextData(t *testing.T) approvalEvent {
	t.Helper()
	ev := r.next(t)
	var data approvalEvent
	require.NoError(t, json.Unmarshal([]byte(ev.Data), &data), "data: %s", ev.Data)
	require.Equal(t, strconv.FormatInt(data.Seq, 10), ev.ID, "the SSE id is the seq")
	require.Equal(t, data.Type, ev.Event, "the SSE event name is the type")
	return data
}

func TestApprovalEventsStreamEachTransitionOfBothKindsWithTheApprovalAsItsRouteShowsIt(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	h := f.s.Handler()
	sse := f.subscribe(t, f.alice)

	tool1 := f.pendingToolCall(t, f.agent, "s1")
	tool2 := f.pendingToolCall(t, f.agent, "s2")
	tool3 := f.pendingToolCall(t, f.agent, "s2")
	over1 := f.overrun(t, f.agent, 5)
	over2 := f.overrun(t, f.agent, 6)
	// Answered by a human: one call, both calls of a tool in a session,
	// an overrun approved, one denied.
	require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice,
		map[string]any{"approval_id": tool1, "decision": "approved"}).Status)
	require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/sessions/s2/tool-approvals", f.alice,
		map[string]any{"tool_name": "send_email", "decision": "denied", "note": "no"}).Status)
	require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/mandate-approvals/"+over1+"/approve", f.alice, map[string]any{}).Status)
	require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/mandate-approvals/"+over2+"/deny", f.alice, map[string]any{}).Status)

	type step struct{ typ, kind, id, state string }
	want := []step{
		{"requested", "tool_call", tool1, "pending"},
		{"requested", "tool_call", tool2, "pending"},
		{"requested", "tool_call", tool3, "pending"},
		{"requested", "mandate_overrun", over1, "pending"},
		{"requested", "mandate_overrun", over2, "pending"},
		{"resolved", "tool_call", tool1, "approved"},
		{"resolved", "tool_call", min(tool2, tool3), "denied"},
		{"resolved", "tool_call", max(tool2, tool3), "denied"},
		{"resolved", "mandate_overrun", over1, "approved"},
		{"resolved", "mandate_overrun", over2, "denied"},
	}
	for i, w := range want {
		ev := sse.nextData(t)
		require.EqualValues(t, i+1, ev.Seq, "seq is gap-free from 1")
		require.Equal(t, w.typ, ev.Type, "event %d", i+1)
		require.Equal(t, w.kind, ev.Kind, "event %d", i+1)
		require.Equal(t, w.id, ev.ApprovalID, "event %d", i+1)
		state := ev.Approval["status"]
		if w.kind == "mandate_overrun" {
			state = ev.Approval["state"]
		}
		require.Equal(t, w.state, state, "event %d", i+1)
	}
	// The approval object is exactly what its GET route shows (the last
	// event of each approval is its state now).
	for _, path := range []string{"/v1/mandate-approvals/" + over2, "/v1/tool-approvals/" + tool1} {
		r := do(t, h, http.MethodGet, path, f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		rows := eventsOf(t, f, r.JSON(t)["id"].(string))
		require.JSONEq(t, string(r.Body), string(rows[len(rows)-1]), path)
	}
}

// eventsOf reads the stored approval objects of an approval's events.
func eventsOf(t *testing.T, f inboxFixture, id string) []json.RawMessage {
	t.Helper()
	rows, err := f.s.svc.DB.Query(context.Background(), `SELECT payload FROM approval_events WHERE approval_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []json.RawMessage
	for rows.Next() {
		var b []byte
		require.NoError(t, rows.Scan(&b))
		out = append(out, b)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestApprovalEventsResumeAfterLastEventIDOrAfterAndStartAtTheEndWithoutEither(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	for range 5 {
		f.overrun(t, f.agent, 1)
	}
	tests := []struct {
		name    string
		headers []string
		first   int64
	}{
		{"Last-Event-ID", []string{"Last-Event-ID", "2"}, 3},
		{"after", []string{"?", "after=4"}, 5},
		{"the header wins", []string{"Last-Event-ID", "1", "?", "after=4"}, 2},
		{"zero replays all", []string{"Last-Event-ID", "0"}, 1},
		{"neither: only new", nil, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sse := f.subscribe(t, f.alice, tt.headers...)
			if tt.first == 6 {
				f.overrun(t, f.agent, 1)
			}
			first := sse.nextData(t)
			require.Equal(t, tt.first, first.Seq)
		})
	}
}

func TestApprovalEventsRefuseWhoIsNoApproverAndBadResumePoints(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	tests := []struct {
		name    string
		tok     string
		headers []string
		status  int
		field   string
	}{
		{"admin without approver", f.adminOnly, nil, http.StatusForbidden, ""},
		{"agent without approver", f.agentOnly, nil, http.StatusForbidden, ""},
		{"approver bound to an agent", f.boundApprover, nil, http.StatusForbidden, ""},
		{"no token", "", nil, http.StatusUnauthorized, ""},
		{"Last-Event-ID not a seq", f.alice, []string{"Last-Event-ID", "x"}, http.StatusBadRequest, "Last-Event-ID"},
		{"after negative", f.alice, []string{"?", "after=-1"}, http.StatusBadRequest, "after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hs []string
			for i := 0; i+1 < len(tt.headers); i += 2 {
				if tt.headers[i] != "?" {
					hs = append(hs, tt.headers[i], tt.headers[i+1])
				}
			}
			r := do(t, f.s.Handler(), http.MethodGet, "/v1/approvals/events"+query(tt.headers), tt.tok, nil, hs...)
			if tt.field != "" {
				r.requireProblem(t, tt.status, tt.field)
			} else {
				r.requireProblem(t, tt.status)
			}
		})
	}
}

func TestAnotherOrgsApprovalEventsNeverAppearAndItsSeqIsItsOwn(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	sseA := f.subscribe(t, f.alice, "Last-Event-ID", "0")
	sseB := f.subscribe(t, f.otherAlice, "Last-Event-ID", "0")
	a1 := f.overrun(t, f.agent, 1)
	b1 := f.overrun(t, f.otherAgent, 1)
	b2 := f.pendingToolCall(t, f.otherAgent, "sb")
	a2 := f.pendingToolCall(t, f.agent, "sa")

	for _, c := range []struct {
		sse  *inboxSSEReader
		want []string
	}{{sseA, []string{a1, a2}}, {sseB, []string{b1, b2}}} {
		for i, id := range c.want {
			ev := c.sse.nextData(t)
			require.EqualValues(t, i+1, ev.Seq)
			require.Equal(t, id, ev.ApprovalID)
		}
	}
	// Nothing else arrives: a keep-alive-free check would wait forever, so
	// append one more in org A and see it is A's third, not B's.
	a3 := f.overrun(t, f.agent, 1)
	ev := sseA.nextData(t)
	require.EqualValues(t, 3, ev.Seq)
	require.Equal(t, a3, ev.ApprovalID)
	select {
	case e := <-sseB.events:
		require.Failf(t, "org B saw an event", "%+v", e)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestApprovalEventsSendKeepAlivesWhileIdle(t *testing.T) {
	f := newInboxFixture(t, 20*time.Millisecond)
	sse := f.subscribe(t, f.alice)
	require.Equal(t, inboxSSE{ID: "0"}, sse.nextBlock(t), "where it stands")
	require.Equal(t, inboxSSE{Comment: "keep-alive"}, sse.nextBlock(t))
}

// A stream starts by saying where it stands, as an SSE id: alone when it
// resumes where asked or at the end, on the reset event when reset. A
// client cut before the next event then resumes from there
// (Last-Event-ID) and misses nothing that came meanwhile — not from the
// end as of its reconnect, which it would without a resume point.
func TestApprovalEventsStartWithTheSeqTheyResumeAfterAsTheirID(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	for range 3 {
		f.overrun(t, f.agent, 1)
	}
	tests := []struct {
		name    string
		headers []string
		first   inboxSSE
	}{
		{"neither: the end", nil, inboxSSE{ID: "3"}},
		{"Last-Event-ID", []string{"Last-Event-ID", "1"}, inboxSSE{ID: "1"}},
		{"after", []string{"?", "after=2"}, inboxSSE{ID: "2"}},
		{"past the end: the reset's id", []string{"Last-Event-ID", "99"}, inboxSSE{ID: "3", Event: "reset", Data: `{"seq":3}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.first, f.subscribe(t, f.alice, tt.headers...).nextBlock(t))
		})
	}

	for _, headers := range [][]string{nil, {"Last-Event-ID", "99"}} {
		// (cut right after the first block; an event comes meanwhile)
		first := f.subscribe(t, f.alice, headers...).nextBlock(t)
		id := f.overrun(t, f.agent, 1)
		resumed := f.subscribe(t, f.alice, "Last-Event-ID", first.ID).nextData(t)
		require.Equal(t, id, resumed.ApprovalID, "resumed after %v", headers)
	}
}

func TestApprovalEventsStartWithResetWhenTheResumePointWasPruned(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	for range 4 {
		f.overrun(t, f.agent, 1)
	}
	// Events 1 and 2 were purged past their retention (internal/retention).
	tag, err := f.s.svc.DB.Exec(context.Background(), `DELETE FROM approval_events WHERE seq <= 2`)
	require.NoError(t, err)
	require.EqualValues(t, 2, tag.RowsAffected())

	tests := []struct {
		after     string
		reset     bool
		firstData int64
	}{
		{"0", true, 3},
		{"1", true, 3},
		{"2", false, 3},
		{"3", false, 4},
	}
	for _, tt := range tests {
		t.Run("after "+tt.after, func(t *testing.T) {
			sse := f.subscribe(t, f.alice, "Last-Event-ID", tt.after)
			if tt.reset {
				ev := sse.next(t)
				require.Equal(t, "reset", ev.Event)
				require.JSONEq(t, `{"seq":2}`, ev.Data)
				require.Equal(t, "2", ev.ID, "the seq to resume after")
			}
			require.Equal(t, tt.firstData, sse.nextData(t).Seq)
		})
	}
}

// Retention may leave a hole above the oldest event it kept (it purges by
// the time an append's transaction began, which does not rise with seq, in
// batches committed one by one, and may purge between the stream's reads):
// the stream says so with a reset where the hole is, never skipping in
// silence what a reader resuming below it had not seen.
func TestApprovalEventsSayResetWhereRetentionLeftAHole(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	for range 4 {
		f.overrun(t, f.agent, 1)
	}
	tag, err := f.s.svc.DB.Exec(context.Background(), `DELETE FROM approval_events WHERE seq = 2`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	sse := f.subscribe(t, f.alice, "Last-Event-ID", "0")
	require.EqualValues(t, 1, sse.nextData(t).Seq)
	ev := sse.next(t)
	require.Equal(t, "reset", ev.Event, "event 2 is gone")
	require.JSONEq(t, `{"seq":2}`, ev.Data)
	require.Equal(t, "2", ev.ID, "the seq to resume after")
	require.EqualValues(t, 3, sse.nextData(t).Seq)
	require.EqualValues(t, 4, sse.nextData(t).Seq)
}

// A resume point past the log's end (a seq from a restored database or
// another deployment) is not waited for in silence: the stream starts with
// a reset to the end, and the next event follows.
func TestApprovalEventsStartWithResetWhenTheResumePointIsPastTheEnd(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	for range 2 {
		f.overrun(t, f.agent, 1)
	}
	for _, resume := range [][]string{{"Last-Event-ID", "999"}, {"Last-Event-ID", "3"}} {
		sse := f.subscribe(t, f.alice, resume...)
		ev := sse.next(t)
		require.Equal(t, "reset", ev.Event, "resuming after %s", resume[1])
		require.JSONEq(t, `{"seq":2}`, ev.Data)
		require.Equal(t, "2", ev.ID, "the seq to resume after")
	}
	sse := f.subscribe(t, f.alice, "Last-Event-ID", "999")
	require.Equal(t, "reset", sse.next(t).Event)
	f.overrun(t, f.agent, 1)
	require.EqualValues(t, 3, sse.nextData(t).Seq)
}

func TestListsAnswerWithTheEventsSeqTheyReflect(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	h := f.s.Handler()
	for _, path := range []string{"/v1/tool-approvals", "/v1/mandate-approvals"} {
		r := do(t, h, http.MethodGet, path, f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.EqualValues(t, 0, r.JSON(t)["events_seq"], path)
	}
	f.overrun(t, f.agent, 1)
	f.pendingToolCall(t, f.agent, "s")
	f.overrun(t, f.otherAgent, 1) // another org's event is not counted
	for _, path := range []string{"/v1/tool-approvals", "/v1/mandate-approvals"} {
		r := do(t, h, http.MethodGet, path, f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.EqualValues(t, 2, r.JSON(t)["events_seq"], path)
	}
}

// A client that lists and then subscribes from the smaller events_seq sees
// every item created meanwhile: each is in a list or in the stream.
func TestNoApprovalIsLostBetweenListAndSubscribe(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	h := f.s.Handler()
	const writers, each = 4, 10
	var created sync.Map
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				var id string
				if i%2 == 0 {
					id = f.overrun(t, f.agent, 1)
				} else {
					id = f.pendingToolCall(t, f.agent, fmt.Sprintf("w%d", w))
				}
				created.Store(id, true)
			}
		}()
	}
	close(start)
	seen := map[string]bool{}
	var seq int64 = -1
	for _, path := range []string{"/v1/tool-approvals?limit=500", "/v1/mandate-approvals?limit=500"} {
		r := do(t, h, http.MethodGet, path, f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		body := r.JSON(t)
		s := int64(body["events_seq"].(float64))
		if seq < 0 || s < seq {
			seq = s
		}
		for _, it := range body["items"].([]any) {
			seen[it.(map[string]any)["id"].(string)] = true
		}
	}
	sse := f.subscribe(t, f.alice, "Last-Event-ID", strconv.FormatInt(seq, 10))
	wg.Wait()
	total := writers * each
	for int64(len(seen)) < int64(total) {
		ev := sse.nextData(t)
		seen[ev.ApprovalID] = true
	}
	created.Range(func(k, _ any) bool {
		require.True(t, seen[k.(string)], "approval %s is in a list or the stream", k)
		return true
	})
}

func TestMandateApprovalsShowWhoAskedAndTheMandatesBudgetAndSpentThen(t *testing.T) {
	f := newInboxFixture(t, time.Minute)
	h := f.s.Handler()
	admin := subToken(t, "org-a", "root", "", RoleAdmin)
	r := do(t, h, http.MethodPost, "/v1/mandates", admin, map[string]any{"agent_id": "agent-1", "scope": "funded", "budget": 10})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	r = do(t, h, http.MethodPost, "/v1/mandates/spend", f.agent, map[string]any{"agent_id": "agent-1", "scope": "funded", "cost": 7})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	tests := []struct {
		scope         string
		budget, spent any
	}{
		{"funded", float64(10), float64(7)},
		{"unfunded", nil, nil}, // no mandate: nothing to show
	}
	for _, tt := range tests {
		t.Run(tt.scope, func(t *testing.T) {
			r := do(t, h, http.MethodPost, "/v1/mandates/spend", f.agent, map[string]any{"agent_id": "agent-1", "scope": tt.scope, "cost": 5})
			require.Equal(t, http.StatusPaymentRequired, r.Status, "body: %s", r.Body)
			got := do(t, h, http.MethodGet, "/v1/mandate-approvals/"+r.JSON(t)["approval_id"].(string), f.alice, nil)
			require.Equal(t, http.StatusOK, got.Status)
			body := got.JSON(t)
			require.Equal(t, "runtime", body["requested_by"])
			require.Equal(t, tt.budget, body["budget"])
			require.Equal(t, tt.spent, body["spent"])
		})
	}
}

// A token is checked when a stream opens; the stream must not outlive it.
// At the token's exp the stream says so and ends (the client reconnects
// with a fresh token).
func TestALiveStreamEndsWhenItsTokenExpires(t *testing.T) {
	f := newInboxFixture(t, time.Hour)
	short, err := SignToken(testSecret, TokenSpec{OrgID: "org-a", Sub: "alice", Roles: []string{RoleApprover}, TTL: 2 * time.Second})
	require.NoError(t, err)
	approvals := f.subscribe(t, short)
	s := newStreamServer(t, streams.Config{KeepAlive: time.Hour})
	shortAgent, err := SignToken(testSecret, TokenSpec{OrgID: "org-a", Sub: "runtime", Roles: []string{RoleAgent}, TTL: 2 * time.Second})
	require.NoError(t, err)
	chunks := openSSE(t, s, shortAgent, "out")
	f.overrun(t, f.agent, 1) // an event before the expiry arrives
	require.NotEmpty(t, approvals.next(t).Data)

	for name, comments := range map[string]func() (string, bool){
		"approvals": func() (string, bool) { ev, ok := <-approvals.events; return ev.Comment, ok },
		"chunks":    func() (string, bool) { ev, ok := <-chunks.events; return ev.Comment, ok },
	} {
		ended := make(chan []string, 1)
		go func() {
			var seen []string
			for {
				c, ok := comments()
				if !ok {
					ended <- seen
					return
				}
				seen = append(seen, c)
			}
		}()
		select {
		case seen := <-ended:
			require.Contains(t, seen, "the token expired; reconnect with a fresh one", name)
		case <-time.After(15 * time.Second):
			t.Fatalf("the %s stream outlived its token", name)
		}
	}
}

// An event's time is sent in UTC whatever the replica's time zone: read
// from Postgres it is in the process's (TZ=Asia/Kolkata sent
// "+05:30"), while every other time of every answer is UTC — the approval
// inside the event, and the webhook's copy of the same event.
func TestAnApprovalEventsTimeIsSentInUTC(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+1800)
	at := time.Date(2026, 12, 5, 21, 25, 45, 337343000, ist)
	buf, err := appendInboxEvents(nil, 0, []inbox.Event{{Seq: 1, Type: "requested", Kind: "tool_call", Approval: json.RawMessage(`{}`), At: at}})
	require.NoError(t, err)
	require.Contains(t, string(buf), `"at":"2026-12-05T15:55:45.337343Z"`)
}
