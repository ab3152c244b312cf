// Package workflows is the Temporal side of Reveille that an agent's own
// worker imports: AwaitWake parks a workflow until its wake-up resolves,
// AwaitApproval until a tool call is approved or denied. It links the
// Temporal SDK and the leaf package signals only — no database driver, no
// HTTP server, no metrics — so that importing it costs a worker nothing
// else. The engine's reference workflow, whose activities call the service
// in process, lives in the subpackage reference.
package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/reveille/reveille/workflows/signals"
)

// TaskQueue is the task queue of the engine's own Temporal worker (engine
// serve --worker, engine dev), which runs the engine's reference workflow
// and nothing else. It is not for a workflow author's workflows: one
// started on it never runs — the engine's worker does not register its
// type, and its workflow tasks fail with "unable to find workflow type".
// Run your workflows on a task queue of your own, polled by a worker of
// your own; Reveille signals a workflow by its id (and the run id a
// request names, if any), whatever queue it runs on.
const TaskQueue = signals.TaskQueue

// Wake is the payload of a wake-up's signal (signals.Wake):
// {org_id, wakeup_id, outcome: succeeded|failed|canceled|denied, result?, error?}.
// Its fields:
//
//   - OrgID: the wake-up's org (AwaitWake returns only wakes of the
//     workflow's own org, its id's prefix).
//   - WakeupID: the wake-up's id, as POST /v1/wakeups answered it.
//   - Outcome: OutcomeSucceeded (the work succeeded), OutcomeFailed (its
//     last attempt failed, or it could never be enqueued), OutcomeCanceled
//     (the wake-up was canceled) or OutcomeDenied (its spend was refused
//     and the approval request was denied or expired: the work never ran).
//   - Result: the handler's JSON result when the work succeeded (absent
//     otherwise, and when the result is JSON null). For the built-in http
//     handler it is {status, headers, body}: the 2xx status, the response
//     headers (each name's values joined by ", ") and the body — as JSON
//     when it parses, else as a JSON string; at most 1 MiB in all, as
//     JSON (a larger one fails the work).
//   - Error: why, unless succeeded: the last attempt's error when failed
//     (for http, e.g. "HTTP 404: " and the start of the body), a cause
//     when canceled, "spend denied" or "spend expired" (with the
//     approver's note, if any) when denied.
type Wake = signals.Wake

// Outcomes a Wake carries (Wake.Outcome).
const (
	OutcomeSucceeded = signals.OutcomeSucceeded
	OutcomeFailed    = signals.OutcomeFailed
	OutcomeCanceled  = signals.OutcomeCanceled
	OutcomeDenied    = signals.OutcomeDenied
)

// Error types of the timeouts (temporal.ApplicationError.Type): a
// workflow that returns ErrTimeout or ErrApprovalTimeout fails with one,
// which its caller — a client, a parent workflow — matches with IsTimeout,
// as errors.Is cannot match a sentinel across the workflow's boundary.
const (
	WakeTimeoutType     = "ReveilleWakeTimeout"
	ApprovalTimeoutType = "ReveilleApprovalTimeout"
)

// ErrTimeout is returned by AwaitWake when no wake came in time. Inside
// the workflow, errors.Is(err, ErrTimeout); outside it, IsTimeout.
var ErrTimeout error = temporal.NewApplicationError("workflows: timed out waiting for the wake signal", WakeTimeoutType)

// IsTimeout reports whether err is (or wraps, or is a workflow failure
// caused by) ErrTimeout or ErrApprovalTimeout: an await that ran out of
// time, seen from inside the workflow or from whoever waited for it.
func IsTimeout(err error) bool {
	var app *temporal.ApplicationError
	for err != nil {
		if !errors.As(err, &app) {
			return false
		}
		if app.Type() == WakeTimeoutType || app.Type() == ApprovalTimeoutType {
			return true
		}
		err = app.Unwrap()
	}
	return false
}

type seenKey struct{}

// heldKey holds decisions that arrived while the workflow awaited another
// approval, by approval id, until an AwaitApproval asks for them.
type heldKey struct{}

type heldDecisions map[string]Decision

// heldWakesKey holds wakes that arrived while the workflow awaited another
// wake-up (AwaitWakeFor), in arrival order, until an await asks for them.
type heldWakesKey struct{}

type heldWake struct {
	signal string
	wake   Wake
}

// heldWakes is a slice, not a map: AwaitWake takes the oldest, and the
// order must be the same on replay.
type heldWakes struct{ wakes []heldWake }

// take removes and returns the oldest held wake on signal of wakeupID (any
// wake-up when wakeupID is "").
func (h *heldWakes) take(signal, wakeupID string) (Wake, bool) {
	if h == nil {
		return Wake{}, false
	}
	for i, hw := range h.wakes {
		if hw.signal == signal && (wakeupID == "" || hw.wake.WakeupID == wakeupID) {
			h.wakes = append(h.wakes[:i], h.wakes[i+1:]...)
			return hw.wake, true
		}
	}
	return Wake{}, false
}

func (h *heldWakes) holds(signal, wakeupID string) bool {
	for _, hw := range h.wakes {
		if hw.signal == signal && hw.wake.WakeupID == wakeupID {
			return true
		}
	}
	return false
}

// seenWakes remembers the wake-up ids (and "approval:"+approval ids) a
// workflow has already been woken for, and in what order it returned them
// (ReturnedIDs hands over the most recently returned: a repeated delivery
// follows its first within minutes, however old its wake-up).
type seenWakes struct {
	ids   map[string]bool
	order []string
}

func (s *seenWakes) has(id string) bool { return s != nil && s.ids[id] }

func (s *seenWakes) mark(id string) {
	if s == nil || s.ids[id] {
		return
	}
	s.ids[id] = true
	s.order = append(s.order, id)
}

// WithWakeDedupe returns a context in which successive AwaitWake and
// AwaitApproval calls ignore repeated deliveries of wake-ups and decisions
// already returned (delivery is at-least-once), and in which a decision
// that arrives while another approval is awaited, or a wake that arrives
// while AwaitWakeFor awaits another wake-up, is kept for the await that
// asks for it (the outbox delivers each once: dropping it would park that
// await until its timeout). The awaits may also run at once, each in a
// coroutine of its own (workflow.Go) sharing the context: each returns its
// own wake or decision whatever order they arrive in. Call it once at the
// top of a workflow that awaits more than one signal; it is deterministic
// because it is rebuilt on replay. (A workflow whose history began before
// parallel awaits were supported keeps the earlier waiting, in which two
// awaits at once may take each other's signals and time out; see
// sharedWaitChange.)
func WithWakeDedupe(ctx workflow.Context) workflow.Context {
	if _, ok := ctx.Value(seenKey{}).(*seenWakes); ok {
		return ctx
	}
	ctx = workflow.WithValue(ctx, heldKey{}, heldDecisions{})
	ctx = workflow.WithValue(ctx, heldWakesKey{}, &heldWakes{})
	ctx = workflow.WithValue(ctx, readersKey{}, signalReaders{})
	return workflow.WithValue(ctx, seenKey{}, &seenWakes{ids: map[string]bool{}})
}

// sharedWaitChange is the workflow.GetVersion change id of the shared wait
// state: awaits in a WithWakeDedupe context wait on the held state, which
// one reader per signal fills, rather than each on the signal channel. It
// changes which await a signal goes to (two awaits in parallel coroutines
// used to take each other's signals, hold them, and both time out), and so
// the commands that follow: a workflow whose history began without it
// (DefaultVersion) keeps waiting the old way so that it still replays.
const sharedWaitChange = "reveille.shared-wait-state"

// sharedWaitVersion is the version of sharedWaitChange that waits on the
// shared state.
const sharedWaitVersion workflow.Version = 1

// readersKey holds the workflow's signalReaders (WithWakeDedupe).
type readersKey struct{}

// signalReaders are the readers of a workflow's signal channels, by kind
// ("wake:" or "approval:") and signal name.
type signalReaders map[string]*signalReader

// signalReader moves what arrives on one signal channel into the held
// state while at least one await waits on that channel. It is one
// coroutine for all the awaits, so that no await takes a signal another
// one waits for: each waits on a condition over the held state instead,
// which the SDK re-evaluates after every step of every coroutine. It stops
// when nobody waits, so that a signal sent between awaits stays on the
// channel as it always did (PendingWakes and PendingDecisions hand over
// both it and what is held before a workflow continues as new).
type signalReader struct {
	waiters int
	running bool
}

// sharedWait returns the workflow's readers when ctx's awaits use the
// shared wait state: a WithWakeDedupe context (without one there is no
// state to share) in a workflow whose history, if it is replayed, was
// begun by code that had it.
func sharedWait(ctx workflow.Context) (signalReaders, bool) {
	readers, ok := ctx.Value(readersKey{}).(signalReaders)
	if !ok {
		return nil, false
	}
	v := workflow.GetVersion(ctx, sharedWaitChange, workflow.DefaultVersion, sharedWaitVersion)
	return readers, v >= sharedWaitVersion
}

// wait registers an await on signal and starts the channel's reader
// unless it runs; hold files each signal it receives. The returned func
// unregisters the await.
func (rs signalReaders) wait(ctx workflow.Context, kind, signal string, hold func(json.RawMessage)) (done func()) {
	key := kind + ":" + signal
	r := rs[key]
	if r == nil {
		r = &signalReader{}
		rs[key] = r
	}
	r.waiters++
	if !r.running {
		r.running = true
		ch := workflow.GetSignalChannel(ctx, signal)
		// Disconnected: one await's cancellation must not stop the reader
		// the others rely on.
		rctx, _ := workflow.NewDisconnectedContext(ctx)
		workflow.GoNamed(rctx, "reveille-reader-"+key, func(rctx workflow.Context) {
			defer func() { r.running = false }()
			for {
				_ = workflow.Await(rctx, func() bool { return r.waiters == 0 || ch.Len() > 0 })
				if r.waiters == 0 {
					return
				}
				// ReceiveAsync skips (and the SDK logs) a payload that does
				// not decode, so a corrupt signal cannot block the reader.
				var raw json.RawMessage
				for ch.ReceiveAsync(&raw) {
					hold(raw)
					raw = nil
				}
			}
		})
	}
	return func() { r.waiters-- }
}

// awaitHeld waits until take takes what the await waits for from the held
// state, the timeout (when > 0) passes (timeoutErr), or ctx is canceled
// (ctx.Err(), workflow.ErrCanceled). take runs inside the condition, so
// that no other coroutine can take it between the check and the taking.
func awaitHeld(ctx workflow.Context, timeout time.Duration, timeoutErr error, take func() bool, late func() bool) error {
	ok := true
	var err error
	if timeout > 0 {
		ok, err = workflow.AwaitWithTimeout(ctx, timeout, take)
	} else {
		err = workflow.Await(ctx, take)
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return err
	}
	if !ok {
		// The timer fired. Signals that came with it in one workflow task
		// (recorded before it, while the worker was away) are still on the
		// channel: the reader runs after this coroutine. Read them first.
		if late != nil && late() && take() {
			return nil
		}
		return timeoutErr
	}
	return nil
}

// lateSignalChange is the workflow.GetVersion change id of reading, when an
// await's timer fires, the signals that came in the same workflow task
// before returning the timeout (they were left to the reader, and the
// await timed out with its answer on the channel). It is asked only then.
const lateSignalChange = "reveille.await-late-signals"

// readLate is awaitHeld's late for the channel named signal: it files what
// is on it with hold, and reports whether there was anything.
func readLate(ctx workflow.Context, signal string, hold func(json.RawMessage)) func() bool {
	return func() bool {
		ch := workflow.GetSignalChannel(ctx, signal)
		if ch.Len() == 0 {
			return false
		}
		if workflow.GetVersion(ctx, lateSignalChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
			return false
		}
		var raw json.RawMessage
		for ch.ReceiveAsync(&raw) {
			hold(raw)
			raw = nil
		}
		return true
	}
}

// OrgOf returns the org a workflow id belongs to: the part before the first
// "/" (Reveille only signals workflows named "<org_id>/…").
func OrgOf(workflowID string) string { return signals.OrgOf(workflowID) }

// AwaitWake parks the workflow on the signal channel named signal until a
// wake arrives, and returns it. It ignores signals whose org_id is not the
// workflow's own org (from its id) and, in a WithWakeDedupe context,
// repeated deliveries of a wake-up already returned. Without that context
// each call returns the next wake delivered, a repeated delivery included
// (delivery is at least once; the dedupe state must live in the context
// the workflow threads through, since a workflow may be replayed from
// scratch on any worker): a workflow that awaits more than one wake calls
// WithWakeDedupe first. A timeout > 0 bounds the wait: ErrTimeout then; 0
// waits without limit. A canceled workflow (or ctx) ends the wait with
// workflow.ErrCanceled (temporal.IsCanceledError). A malformed signal is
// skipped and logged.
//
// signal is the name the wake-up's request gave (POST /v1/wakeups
// requires one; there is no default, unlike AwaitApproval's): an empty one,
// on which no wake ever arrives, is an error, and so is a negative timeout
// (it used to mean no limit, which a deadline already past computes to).
func AwaitWake(ctx workflow.Context, signal string, timeout time.Duration) (Wake, error) {
	if err := checkAwait(ctx, "AwaitWake", signal, timeout); err != nil {
		return Wake{}, err
	}
	return awaitWake(ctx, signal, "", timeout)
}

// AwaitWakeFor is AwaitWake for one wake-up: wakes of other wake-ups on the
// same signal (an earlier run's, another caller's) are skipped — and, in a
// WithWakeDedupe context, kept for a later AwaitWakeFor of theirs (or
// AwaitWake), so a workflow that created two wake-ups may await them in
// either order, or at once from parallel coroutines. Without that context
// they are dropped (the outbox delivers each once, so a later await of
// theirs waits until its timeout), each logged at Warn with its
// wakeup_id. Use it when the workflow knows the id it waits for, as after
// creating the wake-up; an empty id is an error (AwaitWake awaits any).
func AwaitWakeFor(ctx workflow.Context, signal, wakeupID string, timeout time.Duration) (Wake, error) {
	if err := checkAwait(ctx, "AwaitWakeFor", signal, timeout); err != nil {
		return Wake{}, err
	}
	if err := checkAwaitID(ctx, "AwaitWakeFor", "wake-up", wakeupID); err != nil {
		return Wake{}, err
	}
	return awaitWake(ctx, signal, wakeupID, timeout)
}

// argumentCheckChange is the workflow.GetVersion change id of checkAwait:
// before it, an empty signal name waited for good (or until the timeout)
// and a negative timeout meant no limit, and a history begun then must
// replay so. It is asked only when an argument is wrong, so that a
// workflow that passes good ones records no marker for it.
const argumentCheckChange = "reveille.await-argument-errors"

// checkAwait returns the error of an await (fn) asked to wait on an empty
// signal name or with a negative timeout.
func checkAwait(ctx workflow.Context, fn, signal string, timeout time.Duration) error {
	var err error
	switch {
	case signal == "":
		err = fmt.Errorf("workflows: %s: the signal name is empty: pass the signal the wake-up names", fn)
	case timeout < 0:
		err = fmt.Errorf("workflows: %s: negative timeout %v (0 waits without limit)", fn, timeout)
	default:
		return nil
	}
	if workflow.GetVersion(ctx, argumentCheckChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return nil
	}
	return err
}

// emptyIDCheckChange is the workflow.GetVersion change id of checkAwaitID:
// before it, AwaitWakeFor with an empty id returned any wake-up's wake and
// AwaitApproval with one waited for good (or until its timeout), and a
// history begun then must replay so. Asked only when the id is empty.
const emptyIDCheckChange = "reveille.await-empty-id-errors"

// checkAwaitID returns the error of an await (fn) for one wake-up or
// approval (what) asked with an empty id: AwaitWakeFor would take any
// wake-up's wake as the one awaited, AwaitApproval would wait for good
// (no decision is without its approval id).
func checkAwaitID(ctx workflow.Context, fn, what, id string) error {
	if id != "" {
		return nil
	}
	if workflow.GetVersion(ctx, emptyIDCheckChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return nil
	}
	return fmt.Errorf("workflows: %s: the %s id is empty: pass the id its request returned", fn, what)
}

// awaitWake waits for a wake of the workflow's org, not seen before, and of
// wakeupID when that is set.
func awaitWake(ctx workflow.Context, signal, wakeupID string, timeout time.Duration) (Wake, error) {
	if readers, ok := sharedWait(ctx); ok {
		return awaitHeldWake(ctx, readers, signal, wakeupID, timeout)
	}
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(*seenWakes)
	held, _ := ctx.Value(heldWakesKey{}).(*heldWakes)
	if w, ok := held.take(signal, wakeupID); ok {
		seen.mark(w.WakeupID)
		return w, nil
	}
	return awaitSignal(ctx, signal, timeout, ErrTimeout, decodeWake, func(w Wake) skipped {
		switch {
		case w.OrgID != org:
			return skipped{why: "ignoring a wake signal of another org"}
		case seen.has(w.WakeupID):
			return skipped{why: "ignoring a repeated wake delivery"}
		case wakeupID != "" && w.WakeupID != wakeupID && held == nil:
			// Nothing keeps it without WithWakeDedupe, and the outbox
			// delivers each wake once: an await for that wake-up will
			// never get it. Loud, since it parks that await until its
			// timeout.
			return skipped{why: "dropping the wake of another wake-up: without WithWakeDedupe nothing keeps it, and a later AwaitWakeFor of it waits until its timeout; call WithWakeDedupe at the top of the workflow",
				warn: true, kv: []any{"wakeup_id", w.WakeupID, "awaited_wakeup_id", wakeupID}}
		case wakeupID != "" && w.WakeupID != wakeupID:
			if !held.holds(signal, w.WakeupID) {
				held.wakes = append(held.wakes, heldWake{signal, w}) // the first delivery; a repeat is ignored
				return skipped{why: "keeping the wake of another wake-up for its await"}
			}
			return skipped{why: "ignoring the wake of another wake-up"}
		}
		seen.mark(w.WakeupID)
		return skipped{}
	})
}

// awaitHeldWake is awaitWake on the shared wait state: the channel's
// reader holds every new wake of the workflow's org, and the await takes
// the oldest held of wakeupID (of any wake-up when "").
func awaitHeldWake(ctx workflow.Context, readers signalReaders, signal, wakeupID string, timeout time.Duration) (Wake, error) {
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen := ctx.Value(seenKey{}).(*seenWakes)
	held := ctx.Value(heldWakesKey{}).(*heldWakes)
	heldDecs := ctx.Value(heldKey{}).(heldDecisions)
	logger := workflow.GetLogger(ctx)
	var w Wake
	take := func() bool {
		var ok bool
		w, ok = held.take(signal, wakeupID)
		return ok
	}
	if !take() {
		hold := func(raw json.RawMessage) {
			v, ok := decodeWake(raw)
			switch {
			case !ok && holdOtherKind(ctx, raw, org, signal, seen, held, heldDecs):
				// a decision on the same channel: kept for its AwaitApproval
			case !ok:
				logger.Warn("ignoring a malformed signal", "signal", signal)
			case v.OrgID != org:
				logger.Info("ignoring a wake signal of another org", "signal", signal)
			case seen.has(v.WakeupID) || held.holds(signal, v.WakeupID):
				logger.Info("ignoring a repeated wake delivery", "signal", signal, "wakeup_id", v.WakeupID)
			default:
				held.wakes = append(held.wakes, heldWake{signal, v})
			}
		}
		done := readers.wait(ctx, "wake", signal, hold)
		err := awaitHeld(ctx, timeout, ErrTimeout, take, readLate(ctx, signal, hold))
		done()
		if err != nil {
			return Wake{}, err
		}
	}
	seen.mark(w.WakeupID)
	return w, nil
}

// skipped says why awaitSignal passes over a signal (why "": it does not).
type skipped struct {
	why  string
	warn bool  // a loss the workflow's author should hear of, not routine
	kv   []any // logged with why
}

// awaitSignal is the one waiting loop behind AwaitWake and AwaitApproval:
// it receives signals on the channel named signal until decode reads one
// and skip (which may record it as seen) has no reason to skip it, the
// timeout (when > 0) fires (timeoutErr), or the workflow is canceled. Skipped
// and malformed signals are logged and consumed.
func awaitSignal[T any](ctx workflow.Context, signal string, timeout time.Duration, timeoutErr error,
	decode func(json.RawMessage) (T, bool), skip func(T) skipped) (T, error) {
	logger := workflow.GetLogger(ctx)
	ch := workflow.GetSignalChannel(ctx, signal)

	var zero T
	var timedOut bool
	var timer workflow.Future
	if timeout > 0 {
		tctx, timerCancel := workflow.WithCancel(ctx)
		timer = workflow.NewTimer(tctx, timeout)
		defer timerCancel()
	}
	for {
		var v T
		var got, received bool
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(ch, func(c workflow.ReceiveChannel, _ bool) {
			// ReceiveAsync, not Receive: the SDK drops (and logs) a payload
			// its data converter cannot decode, and Receive would then
			// block here for the next signal, past the timer and the
			// cancellation.
			var raw json.RawMessage
			received = true
			if c.ReceiveAsync(&raw) {
				v, got = decode(raw)
			}
		})
		if timer != nil {
			sel.AddFuture(timer, func(workflow.Future) { timedOut = true })
		}
		// A canceled workflow stops waiting (also without a timeout).
		sel.AddReceive(ctx.Done(), func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.Select(ctx)
		if got {
			s := skip(v)
			if s.why == "" {
				// A signal received in the same step as a cancellation is
				// still returned: it was taken off the channel.
				return v, nil
			}
			kv := append([]any{"signal", signal}, s.kv...)
			if s.warn {
				logger.Warn(s.why, kv...)
			} else {
				logger.Info(s.why, kv...)
			}
		} else if received {
			logger.Warn("ignoring a malformed signal", "signal", signal)
		}
		if err := ctx.Err(); err != nil {
			return zero, err
		}
		if timedOut {
			return zero, timeoutErr
		}
	}
}

// sameChannelChange is the workflow.GetVersion change id of keeping a
// wake that arrives on the channel an AwaitApproval reads, or a decision
// on the channel an AwaitWake reads (a workflow may name one signal for
// both): before it, each was dropped as malformed. It is asked only when
// such a signal arrives.
const sameChannelChange = "reveille.same-channel-kinds"

// holdOtherKind keeps raw, met by the reader of the other kind, if it is a
// wake or a decision of the workflow's org not seen nor held before; it
// reports whether raw was one (kept, or a repeat).
func holdOtherKind(ctx workflow.Context, raw json.RawMessage, org, signal string, seen *seenWakes, wakes *heldWakes, decisions heldDecisions) bool {
	d, isDecision := decodeDecision(raw)
	w, isWake := decodeWake(raw)
	if !isDecision && !isWake {
		return false
	}
	if workflow.GetVersion(ctx, sameChannelChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return false
	}
	switch {
	case isWake:
		if w.OrgID == org && !seen.has(w.WakeupID) && !wakes.holds(signal, w.WakeupID) {
			wakes.wakes = append(wakes.wakes, heldWake{signal, w})
		}
	case isDecision:
		if _, holds := decisions[d.ApprovalID]; d.OrgID == org && !seen.has("approval:"+d.ApprovalID) && !holds {
			decisions[d.ApprovalID] = d
		}
	}
	return true
}
