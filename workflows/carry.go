package workflows

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"go.temporal.io/sdk/workflow"
)

// A run that continues as new must drain its signal channels first
// (Temporal refuses to lose a signal), and the outbox delivers each wake
// and decision once: whatever the run received and did not return has to
// travel to the next run in its input. In a WithWakeDedupe context the
// run also holds, off the channel, wakes and decisions that arrived while
// it awaited others; draining the channel alone would miss those.
// PendingWakes and PendingDecisions hand both over; HoldWakes and
// HoldDecisions give them to the next run's awaits. Delivery is at least
// once (a send that timed out after Temporal took it is sent again, to
// whatever run is current by then), so the ids the run's awaits returned
// travel too: ReturnedIDs hands them over and HoldReturned gives them to
// the next run, whose awaits then drop a repeat of one.

// PendingWakes removes and returns the wakes on signal that the run has
// received and not returned, in arrival order: those a WithWakeDedupe
// context holds for a later await, then those still on the channel (of the
// workflow's org, well formed, and — in a WithWakeDedupe context, the only
// one that records what the run returned — not returned before: without
// it, a repeated delivery of a wake already returned is handed over too).
// A decision it meets on the channel (a workflow may name one signal for
// both kinds) is held for PendingDecisions, in a WithWakeDedupe context.
// Call it when no await
// is running, just before continuing as new, and pass the result to the
// next run, which gives it to its awaits with HoldWakes.
func PendingWakes(ctx workflow.Context, signal string) []Wake {
	var out []Wake
	held, _ := ctx.Value(heldWakesKey{}).(*heldWakes)
	decisions, _ := ctx.Value(heldKey{}).(heldDecisions)
	if held != nil {
		for {
			w, ok := held.take(signal, "")
			if !ok {
				break
			}
			out = append(out, w)
		}
	}
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(*seenWakes)
	ch := workflow.GetSignalChannel(ctx, signal)
	var raw json.RawMessage
	for ch.ReceiveAsync(&raw) {
		w, ok := decodeWake(raw)
		if !ok && held != nil {
			// (a decision on the same channel: held for PendingDecisions)
			holdOtherKind(ctx, raw, org, signal, seen, held, decisions)
		}
		raw = nil
		if !ok || w.OrgID != org || seen.has(w.WakeupID) ||
			slices.ContainsFunc(out, func(o Wake) bool { return o.WakeupID == w.WakeupID }) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// HoldWakes gives the run wakes on signal that its previous run handed
// over (PendingWakes): later awaits take them as if they had just arrived.
// It returns a WithWakeDedupe context (ctx itself when it is one); use it
// for the awaits.
func HoldWakes(ctx workflow.Context, signal string, wakes []Wake) workflow.Context {
	ctx = WithWakeDedupe(ctx)
	held := ctx.Value(heldWakesKey{}).(*heldWakes)
	for _, w := range wakes {
		if !held.holds(signal, w.WakeupID) {
			held.wakes = append(held.wakes, heldWake{signal, w})
		}
	}
	return ctx
}

// PendingDecisions removes and returns the tool approvals' decisions the
// run has received and not returned: every decision a WithWakeDedupe
// context holds for a later AwaitApproval (by approval id), then those
// still on the channel named signal ("": ApprovalSignal) of the workflow's
// org, well formed and (in a WithWakeDedupe context) not returned before,
// in arrival order. As
// PendingWakes, for a run about to continue as new; the next run gives
// them to its awaits with HoldDecisions.
func PendingDecisions(ctx workflow.Context, signal string) []Decision {
	signal = cmp.Or(signal, ApprovalSignal)
	var out []Decision
	held, _ := ctx.Value(heldKey{}).(heldDecisions)
	wakes, _ := ctx.Value(heldWakesKey{}).(*heldWakes)
	for _, id := range slices.Sorted(maps.Keys(held)) { // (map order is not deterministic)
		out = append(out, held[id])
		delete(held, id)
	}
	org := OrgOf(workflow.GetInfo(ctx).WorkflowExecution.ID)
	seen, _ := ctx.Value(seenKey{}).(*seenWakes)
	ch := workflow.GetSignalChannel(ctx, signal)
	var raw json.RawMessage
	for ch.ReceiveAsync(&raw) {
		d, ok := decodeDecision(raw)
		if !ok && wakes != nil {
			// (a wake on the same channel: held for PendingWakes)
			holdOtherKind(ctx, raw, org, signal, seen, wakes, held)
		}
		raw = nil
		if !ok || d.OrgID != org || seen.has("approval:"+d.ApprovalID) ||
			slices.ContainsFunc(out, func(o Decision) bool { return o.ApprovalID == d.ApprovalID }) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// HoldDecisions gives the run decisions its previous run handed over
// (PendingDecisions): a later AwaitApproval of each returns it at once. It
// returns a WithWakeDedupe context (ctx itself when it is one); use it for
// the awaits.
func HoldDecisions(ctx workflow.Context, decisions []Decision) workflow.Context {
	ctx = WithWakeDedupe(ctx)
	held := ctx.Value(heldKey{}).(heldDecisions)
	for _, d := range decisions {
		if _, ok := held[d.ApprovalID]; !ok {
			held[d.ApprovalID] = d
		}
	}
	return ctx
}

// maxCarriedReturned bounds the ids of each kind (wake-ups, approvals)
// ReturnedIDs hands over, so that a loop that continues as new for ever
// does not carry every id it ever returned: the most recently returned are
// kept, which are the ones a repeat can still come for (a repeat is the
// outbox's retry of a send whose outcome it did not learn, within
// minutes) — whatever their wake-up's age: one whose spend awaited a human
// for a day is returned after many younger ones.
const maxCarriedReturned = 1000

// ReturnedIDs returns the ids of the wake-ups this run's awaits returned
// (and "approval:" + the ids of the decisions), after those its previous
// run handed over (HoldReturned): the most recently returned
// maxCarriedReturned of each kind, in the order returned. Pass them to the
// next run with PendingWakes' and PendingDecisions' results.
func ReturnedIDs(ctx workflow.Context) []string {
	seen, _ := ctx.Value(seenKey{}).(*seenWakes)
	if seen == nil {
		return nil
	}
	var wakes, approvals []string
	for _, id := range seen.order {
		if strings.HasPrefix(id, "approval:") {
			approvals = append(approvals, id)
		} else {
			wakes = append(wakes, id)
		}
	}
	last := func(ids []string) []string { return ids[max(len(ids)-maxCarriedReturned, 0):] }
	return append(last(wakes), last(approvals)...)
}

// HoldReturned gives the run the ids its previous run's awaits returned
// (ReturnedIDs): its awaits drop a repeated delivery of one. It returns a
// WithWakeDedupe context (ctx itself when it is one); use it for the
// awaits.
func HoldReturned(ctx workflow.Context, ids []string) workflow.Context {
	ctx = WithWakeDedupe(ctx)
	seen := ctx.Value(seenKey{}).(*seenWakes)
	for _, id := range ids {
		seen.mark(id)
	}
	return ctx
}
