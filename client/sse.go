package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Event is one Server-Sent Event.
type Event struct {
	// ID is the event's id (the server's last-event-id once dispatched).
	ID string
	// Type is the event's type: "message" when the server names none.
	Type string
	// Data is the event's data, its lines joined by "\n".
	Data string
}

// DefaultSSEIdleTimeout is how long an SSE connection may stay silent
// before the client takes it for dead and reconnects: three of the
// server's 15-second keep-alives.
const DefaultSSEIdleTimeout = 45 * time.Second

// maxSSELine bounds one line of an event stream: a chunk of the largest
// size the API accepts (1 MiB by default, 16 MiB at most:
// streams.MaxChunkLimit) is 4/3 of that in base64.
const maxSSELine = 32 << 20

// events follows an SSE endpoint, reconnecting after a cut connection (or
// one silent for longer than idle, from the request on: its headers are
// waited for that long) with Last-Event-ID set to the id of the last event
// dispatched, so that the server resumes right after it. An event cut
// short by the connection is never dispatched: the server sends it again.
//
// Reconnects follow the client's ReconnectPolicy, not its RetryPolicy: a
// live reader rides out an outage — a restart, a deploy, a load balancer's
// 503s — until its context ends (or the policy's MaxOutage), waiting a
// backoff that grows while attempts fail in a row — never less than the
// reconnection time the stream set (a retry field), as the WHATWG standard
// has a reader wait — or the Retry-After of a 429 or 503. A healthy connection — one the server opened (200, an event
// stream) that brought a byte (an event or a keep-alive) or stayed open
// for healthyAfter — ends the outage: the backoff starts again from the
// first step, and the outage is counted from its end. An answer retrying
// cannot change (a 400, 401, 403, 404, 410 …; see Error.retryable), a 200
// that is not an event stream, a redirect (not followed) and a line longer
// than maxSSELine end the iteration at once. The iteration ends when the
// consumer stops, or with an error (yielded once).
func (c *Client) events(ctx context.Context, ep endpoint, lastID string, idle time.Duration, opts []CallOption) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		if ep.argErr != nil {
			yield(Event{}, ep.argErr)
			return
		}
		p := c.reconnect
		// failures counts the attempts that failed since the last healthy
		// connection ended (or the start), at outage.
		failures := 0
		outage := time.Now()
		var lastErr error
		var reconnectTime time.Duration // the stream's retry field (0: none)
		for {
			healthy, stop, err := c.followOnce(ctx, ep, &lastID, &reconnectTime, idle, opts, yield)
			if stop {
				return
			}
			if !healthy && ctx.Err() != nil {
				// (the caller ended this attempt — answered or not — it did
				// not fail: the outage, if any, is the attempts before it)
				yield(Event{}, p.ended(ctx, ep, failures, outage, lastErr))
				return
			}
			if healthy {
				failures, outage = 0, time.Now()
			} else {
				failures++
			}
			lastErr = err
			if ctx.Err() != nil {
				yield(Event{}, p.ended(ctx, ep, failures, outage, lastErr))
				return
			}
			var retryAfter time.Duration
			var apiErr *Error
			if errors.As(err, &apiErr) {
				if !apiErr.retryable() {
					yield(Event{}, err)
					return
				}
				retryAfter = apiErr.RetryAfter
			}
			wait := max(p.backoff(max(failures, 1)), reconnectTime)
			if retryAfter > 0 {
				var until time.Time // (none: no MaxOutage)
				if p.MaxOutage > 0 {
					until = outage.Add(p.MaxOutage)
				}
				wait = pastRetryAfter(ctx, retryAfter, until)
			}
			if endsPastDeadline(ctx, wait) && apiErr != nil && retryAfter > 0 {
				// (the server says no earlier; the context ends before: its
				// answer is the reason, at once — not a deadline error later)
				yield(Event{}, fmt.Errorf("client: following %s: the answer's Retry-After (%s) ends past the context's deadline: %w", ep.path, retryAfter, err))
				return
			}
			if p.MaxOutage > 0 && time.Since(outage)+wait > p.MaxOutage {
				yield(Event{}, fmt.Errorf("client: following %s: no healthy connection for %s (ReconnectPolicy.MaxOutage %s): %s: %w",
					ep.path, time.Since(outage).Round(time.Millisecond), p.MaxOutage, attemptsFailed(failures), err))
				return
			}
			if sleep(ctx, wait) != nil {
				yield(Event{}, p.ended(ctx, ep, failures, outage, lastErr))
				return
			}
		}
	}
}

// ended is the error of a live reader whose context ended: the context's
// error, and, when it ended in an outage, the last attempt's too.
func (p ReconnectPolicy) ended(ctx context.Context, ep endpoint, failures int, outage time.Time, lastErr error) error {
	if failures == 0 || lastErr == nil {
		return ctx.Err()
	}
	return fmt.Errorf("client: following %s: %w after %s with no healthy connection: %s: %w",
		ep.path, ctx.Err(), time.Since(outage).Round(time.Millisecond), attemptsFailed(failures), lastErr)
}

// attemptsFailed says how many connection attempts failed in a row since
// the last healthy connection (or the start).
func attemptsFailed(n int) string {
	switch n {
	case 0:
		return "the healthy connection ended"
	case 1:
		return "1 connection attempt failed"
	}
	return fmt.Sprintf("%d connection attempts failed in a row", n)
}

// healthyAfter is how long an opened connection must stay open, when
// nothing came on it, to count as healthy (see events).
const healthyAfter = time.Second

// followOnce opens one connection and yields its events until it ends. It
// reports whether the connection was healthy (see events), and stop when
// the iteration must end (the consumer stopped, or an error it yielded).
func (c *Client) followOnce(ctx context.Context, ep endpoint, lastID *string, reconnectTime *time.Duration, idle time.Duration, opts []CallOption, yield func(Event, error) bool) (healthy, stop bool, err error) {
	connCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	hdr := http.Header{"Cache-Control": {"no-cache"}}
	if *lastID != "" {
		hdr.Set("Last-Event-ID", *lastID)
	}
	o := callOptionsOf(opts)
	for name, values := range o.header {
		hdr[name] = append(hdr[name], values...)
	}
	// The idle timeout covers the wait for the answer's headers too: a
	// server (or a proxy) that took the request and never answers is as
	// dead as one gone silent mid-stream.
	watchdog := time.AfterFunc(idle, cancel)
	defer watchdog.Stop()
	res, err := c.send(connCtx, nil, ep, nil, "", hdr)
	if err != nil && res != nil {
		// A redirect not followed (see do): the next attempt meets it again.
		return false, true, yieldErr(yield, fmt.Errorf("client: following %s: answered %d %s redirecting to %q, not followed (the API redirects no call: check the base URL and what is in front of the API): %w",
			ep.path, res.StatusCode, http.StatusText(res.StatusCode), res.Header.Get("Location"), err))
	}
	if tokErr := (*tokenError)(nil); errors.As(err, &tokErr) && connCtx.Err() == nil {
		// Nothing was sent: the token function failed, and ends the
		// reader as it fails any call (a retry would only ask it again).
		// (Cut by the idle timeout or the caller instead, it is one as
		// any other attempt.)
		return false, true, yieldErr(yield, fmt.Errorf("client: following %s: %w", ep.path, err))
	}
	if err != nil {
		if ctx.Err() == nil && connCtx.Err() != nil {
			err = fmt.Errorf("no answer within the idle timeout (%s): %w", idle, err)
		}
		return false, false, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		apiErr, err := errorFrom(res)
		if err != nil {
			// (cut inside its body: a failed connection, tried again)
			return false, false, fmt.Errorf("reading the %d answer: %w", res.StatusCode, err)
		}
		o.respondHeaders(res)
		return false, false, apiErr
	}
	o.respondHeaders(res)
	if !isMediaType(res, "text/event-stream") {
		return false, true, yieldErr(yield, fmt.Errorf("client: %s answered %q, not an event stream", ep.path, res.Header.Get("Content-Type")))
	}
	opened := time.Now()
	watchdog.Reset(idle)
	gotBytes := false
	r := newEventReader(&resettingReader{r: res.Body, reset: func() { gotBytes = true; watchdog.Reset(idle) }})
	for {
		ev, err := r.next()
		if r.lastIDSet {
			*lastID = r.lastID // ("" too: an empty id field clears it)
		}
		if r.retrySet {
			*reconnectTime = r.retry
		}
		if errors.Is(err, bufio.ErrTooLong) {
			return true, true, yieldErr(yield, fmt.Errorf("client: following %s: a line longer than %d bytes", ep.path, maxSSELine))
		}
		if err != nil {
			return gotBytes || time.Since(opened) >= healthyAfter, false, err
		}
		// The consumer's time is not the server's silence.
		watchdog.Stop()
		if !yield(ev, nil) {
			return true, true, nil
		}
		watchdog.Reset(idle)
	}
}

// respondHeaders hands WithResponse's f a connection's answer, without
// its body (see WithResponse).
func (o *callOptions) respondHeaders(res *http.Response) {
	if o.onResponse != nil {
		head := *res
		head.Body = http.NoBody
		o.onResponse(&head)
	}
}

// yieldErr yields err and returns it.
func yieldErr(yield func(Event, error) bool, err error) error {
	yield(Event{}, err)
	return err
}

// resettingReader calls reset whenever bytes arrive (keep-alives too).
type resettingReader struct {
	r     io.Reader
	reset func()
}

func (r *resettingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.reset()
	}
	return n, err
}

// eventReader parses an event stream as the WHATWG HTML standard's
// "interpreting an event stream" says.
type eventReader struct {
	sc *bufio.Scanner
	// lastID is the last event ID buffer as of the last dispatch
	// (lastIDSet: a dispatch on this connection set it).
	lastID    string
	lastIDSet bool
	// idBuf is the id field seen since the last dispatch.
	idBuf  string
	idSeen bool
	// started is set once the first line was read: a byte order mark
	// begins only the stream.
	started bool
	// retry is the reconnection time the last retry field set (retrySet:
	// one did; 0 is a time too).
	retry    time.Duration
	retrySet bool
}

func newEventReader(r io.Reader) *eventReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	sc.Split(scanSSELines)
	return &eventReader{sc: sc}
}

// next returns the next event; an event whose blank line never came (the
// connection ended first) is dropped, as the standard says.
func (r *eventReader) next() (Event, error) {
	var data strings.Builder
	var typ string
	hasData := false
	for r.sc.Scan() {
		line := r.sc.Text()
		if !r.started {
			// One leading UTF-8 BOM is ignored, as the standard says (its
			// decoder strips it); a later one is part of the line.
			r.started = true
			line = strings.TrimPrefix(line, "\uFEFF")
		}
		if line == "" {
			// Dispatch. The id is taken even when there is no data.
			if r.idSeen {
				r.lastID, r.lastIDSet, r.idSeen = r.idBuf, true, false
			}
			if !hasData {
				typ = ""
				continue
			}
			ev := Event{ID: r.lastID, Type: cmpOr(typ, "message"), Data: strings.TrimSuffix(data.String(), "\n")}
			return ev, nil
		}
		if line[0] == ':' {
			continue // a comment: keep-alive
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			typ = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				r.idBuf, r.idSeen = value, true
			}
		case "retry":
			// (ASCII digits only, in milliseconds; anything else is ignored)
			if ms, err := strconv.ParseUint(value, 10, 32); err == nil {
				r.retry, r.retrySet = time.Duration(ms)*time.Millisecond, true
			}
		}
	}
	if err := r.sc.Err(); err != nil {
		return Event{}, err
	}
	return Event{}, io.ErrUnexpectedEOF
}

// scanSSELines splits lines ended by CRLF, LF or CR.
func scanSSELines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		// A CR: a CRLF may have its LF in the next read.
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		}
		if atEOF {
			return i + 1, data[:i], nil
		}
		return 0, nil, nil
	}
	if atEOF && len(data) > 0 {
		// An unterminated last line cannot end an event: drop it.
		return len(data), nil, nil
	}
	return 0, nil, nil
}

// TailParams say where a live tail starts.
type TailParams struct {
	// StartIndex is the first chunk to send (default 0; a negative one is
	// the server's 400, yielded as the iteration's error).
	StartIndex int64
	// IdleTimeout is how long the connection may stay silent, keep-alives
	// included — the wait for its answer's headers too — before the client
	// reconnects (default DefaultSSEIdleTimeout).
	IdleTimeout time.Duration
}

// ErrStreamGap is yielded when a tail would skip chunks: the server sent an
// index past the next one expected, or ended the stream at an index past
// the last chunk yielded. Reveille's streams are gap-free, so it means that
// retention purged the closed stream before it was read to the end (see
// REVEILLE_STREAM_RETENTION), or a broken server or proxy.
var ErrStreamGap = errors.New("client: the stream skipped chunks")

// Tail follows a stream live (GET …/sse): the chunks stored from
// StartIndex on, then each one as it commits, until the stream is closed
// and every chunk was yielded (the iteration then ends without error). A
// cut connection is resumed with Last-Event-ID from the last chunk
// yielded: no chunk is yielded twice or skipped. Connections are opened
// again by the client's ReconnectPolicy, whatever its RetryPolicy: an
// outage is ridden out until ctx ends (or the policy's MaxOutage), and an
// answer retrying cannot change (a 403, a 404 …) is the iteration's error
// at once.
func (s *StreamsService) Tail(ctx context.Context, runID, name string, p TailParams, opts ...CallOption) iter.Seq2[StreamChunk, error] {
	q := url.Values{}
	if p.StartIndex != 0 {
		// (a negative one too: the server's 400 names it)
		q.Set("start_index", strconv.FormatInt(p.StartIndex, 10))
	}
	ep := endpoint{method: http.MethodGet, path: streamPath(runID, name, "sse"), query: q, accept: "text/event-stream",
		argErr: needArgs("Streams.Tail", "runID", runID, "name", name)}
	idle := p.IdleTimeout
	if idle <= 0 {
		idle = DefaultSSEIdleTimeout
	}
	return func(yield func(StreamChunk, error) bool) {
		next := p.StartIndex
		for ev, err := range s.c.events(ctx, ep, "", idle, opts) {
			if err != nil {
				yield(StreamChunk{}, err)
				return
			}
			kind, ch, err := tailEvent(ev, next)
			switch {
			case err != nil:
				yield(StreamChunk{}, err)
				return
			case kind == tailEnd:
				return
			case kind == tailOther, ch.Index < next:
				continue // a later API's event, or a chunk sent again after a reconnect
			}
			next = ch.Index + 1
			if !yield(ch, nil) {
				return
			}
		}
	}
}

type tailEventKind int

const (
	tailChunk tailEventKind = iota
	tailEnd
	tailOther
)

// tailEvent reads one event of a stream tail: a chunk, or the end.
func tailEvent(ev Event, next int64) (kind tailEventKind, ch StreamChunk, err error) {
	switch ev.Type {
	case "end":
		var tail struct {
			TailIndex int64 `json:"tail_index"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &tail); err != nil {
			return tailChunk, ch, fmt.Errorf("client: a malformed end event %q: %w", ev.Data, err)
		}
		if tail.TailIndex >= next {
			return tailChunk, ch, fmt.Errorf("%w: it ended at %d, but the last chunk yielded was %d", ErrStreamGap, tail.TailIndex, next-1)
		}
		return tailEnd, ch, nil
	case "message":
		idx, err := strconv.ParseInt(ev.ID, 10, 64)
		if err != nil {
			return tailChunk, ch, fmt.Errorf("client: a chunk event with id %q, not an index", ev.ID)
		}
		if idx > next {
			return tailChunk, ch, fmt.Errorf("%w: got %d, expected %d", ErrStreamGap, idx, next)
		}
		data, err := base64.StdEncoding.DecodeString(ev.Data)
		if err != nil {
			return tailChunk, ch, fmt.Errorf("client: chunk %d is not base64: %w", idx, err)
		}
		return tailChunk, StreamChunk{Index: idx, Data: data}, nil
	}
	return tailOther, ch, nil // an event type of a later API: skipped
}
