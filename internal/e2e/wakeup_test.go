package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workflows"
	"github.com/reveille/reveille/workflows/reference"
)

func TestParkedWorkflowIsWokenWithTheHandlersResult(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)

	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{"answer": 42}))
	wakes := s.wakesOf(run)
	require.Len(t, wakes, 1)
	require.Equal(t, workflows.Wake{OrgID: org, WakeupID: id, Outcome: "succeeded", Result: json.RawMessage(`{"answer":42}`)}, normalize(wakes[0]))

	w := s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })
	require.Equal(t, "succeeded", w["outcome"])
	require.Equal(t, "sent", delivery(w)["state"])
	require.Nil(t, w["approval"])
	spent, ledger := s.spent()
	require.EqualValues(t, 1, spent)
	require.EqualValues(t, 1, ledger)
}

func TestWorkflowIsWokenWithFailedAfterRetriesAreExhausted(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	body := wakeupBody(wf, "fail", map[string]any{})
	body["work"].(map[string]any)["retry"] = map[string]any{"max_attempts": 3, "initial_backoff_ms": 10, "base": 2}

	id := s.createWakeup(body)
	wakes := s.wakesOf(run)
	require.Equal(t, "failed", wakes[0].Outcome)
	require.Equal(t, id, wakes[0].WakeupID)
	require.Contains(t, wakes[0].Error, "boom on attempt 3")
	require.EqualValues(t, 3, s.handler.calls.Load())
}

func TestCancelWakesTheWorkflowWithCanceled(t *testing.T) {
	t.Run("before the work starts", func(t *testing.T) {
		s := newStack(t)
		s.fund(10)
		// Fill the single pool's only slot so the second item waits.
		blocker := s.createWakeup(withPool(wakeupBody(s.workflowID(), "block", map[string]any{"tag": "blocker"}), "single"))
		require.Equal(t, "blocker", <-s.handler.started)
		wf := s.workflowID()
		run := s.park(wf, "wake", 1, 0)
		id := s.createWakeup(withPool(wakeupBody(wf, "echo", map[string]any{}), "single"))

		r := s.call(http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, org, "agent"), nil)
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		wakes := s.wakesOf(run)
		require.Equal(t, "canceled", wakes[0].Outcome)
		require.EqualValues(t, 1, s.handler.calls.Load(), "the canceled work never ran")
		s.call(http.MethodPost, "/v1/wakeups/"+blocker+"/cancel", token(t, org, "agent"), nil)
	})
	t.Run("while the work runs", func(t *testing.T) {
		s := newStack(t)
		s.fund(10)
		wf := s.workflowID()
		run := s.park(wf, "wake", 1, 0)
		id := s.createWakeup(wakeupBody(wf, "block", map[string]any{"tag": "running"}))
		require.Equal(t, "running", <-s.handler.started)

		r := s.call(http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, org, "agent"), nil)
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		wakes := s.wakesOf(run)
		require.Equal(t, "canceled", wakes[0].Outcome)
		w := s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })
		require.Equal(t, "canceled", w["outcome"])

		again := s.call(http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, org, "agent"), nil)
		require.Equal(t, http.StatusOK, again.status, "canceling a settled wake-up is a no-op")
		require.Equal(t, "canceled", again.body["outcome"])
	})
	t.Run("while awaiting approval", func(t *testing.T) {
		s := newStack(t) // no mandate: refused
		wf := s.workflowID()
		run := s.park(wf, "wake", 1, 0)
		r := s.call(http.MethodPost, "/v1/wakeups", token(t, org, "agent"), wakeupBody(wf, "echo", map[string]any{}))
		require.Equal(t, http.StatusPaymentRequired, r.status, string(r.raw))
		id, approval := r.body["wakeup_id"].(string), r.body["approval_id"].(string)

		c := s.call(http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, org, "agent"), nil)
		require.Equal(t, http.StatusOK, c.status, string(c.raw))
		wakes := s.wakesOf(run)
		require.Equal(t, "canceled", wakes[0].Outcome)
		w := s.getWakeup(id)
		require.Equal(t, map[string]any{"id": approval, "state": "canceled"}, w["approval"])
		require.Zero(t, s.handler.calls.Load())
	})
}

func TestRefusedSpendIsResolvedByAHuman(t *testing.T) {
	refuse := func(t *testing.T, s *stack) (wf, id, approval string) {
		t.Helper()
		wf = s.workflowID()
		r := s.call(http.MethodPost, "/v1/wakeups", token(t, org, "agent"), wakeupBody(wf, "echo", map[string]any{"x": 1}))
		require.Equal(t, http.StatusPaymentRequired, r.status, string(r.raw))
		require.Equal(t, "application/problem+json", "application/problem+json")
		id, approval = r.body["wakeup_id"].(string), r.body["approval_id"].(string)
		require.NotEmpty(t, id)
		require.NotEmpty(t, approval)
		require.Zero(t, s.count(`SELECT count(*) FROM workpool_work`), "no work before approval")
		w := s.getWakeup(id)
		require.Equal(t, "pending", w["status"])
		require.Equal(t, "waiting", delivery(w)["state"])
		require.Equal(t, map[string]any{"id": approval, "state": "pending"}, w["approval"])
		return wf, id, approval
	}
	t.Run("approval runs the work and wakes the workflow", func(t *testing.T) {
		s := newStack(t)
		wf, id, approval := refuse(t, s)
		run := s.park(wf, "wake", 1, 0)
		r := s.call(http.MethodPost, "/v1/mandate-approvals/"+approval+"/approve", token(t, org, "approver"), map[string]any{"note": "ok"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		wakes := s.wakesOf(run)
		require.Equal(t, "succeeded", wakes[0].Outcome)
		require.Equal(t, id, wakes[0].WakeupID)
		spent, ledger := s.spent()
		require.EqualValues(t, 1, spent, "the approved overrun is charged once")
		require.Equal(t, spent, ledger)
	})
	t.Run("denial wakes the workflow with denied", func(t *testing.T) {
		s := newStack(t)
		wf, id, approval := refuse(t, s)
		run := s.park(wf, "wake", 1, 0)
		r := s.call(http.MethodPost, "/v1/mandate-approvals/"+approval+"/deny", token(t, org, "approver"), map[string]any{"note": "too pricey"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		wakes := s.wakesOf(run)
		require.Equal(t, "denied", wakes[0].Outcome)
		require.Equal(t, id, wakes[0].WakeupID)
		require.Zero(t, s.handler.calls.Load())
	})
	t.Run("expiry wakes the workflow with denied", func(t *testing.T) {
		s := newStack(t)
		wf, id, approval := refuse(t, s)
		run := s.park(wf, "wake", 1, 0)
		_, err := s.db.Exec(context.Background(), `UPDATE mandate_approvals SET expires_at = now() WHERE id = $1`, approval)
		require.NoError(t, err)
		wakes := s.wakesOf(run)
		require.Equal(t, "denied", wakes[0].Outcome)
		require.Equal(t, id, wakes[0].WakeupID)
		require.Equal(t, "expired", s.getWakeup(id)["approval"].(map[string]any)["state"])
	})
}

func TestReconcilerEnqueuesAnIntentLeftFundedByACrash(t *testing.T) {
	crashed := make(chan uuid.UUID, 1)
	s := newStack(t, func(o *stackOptions) {
		o.beforeEnqueue = func(_ context.Context, id uuid.UUID) error {
			select {
			case crashed <- id:
				return context.Canceled // as if the process died between the two transactions
			default:
				return nil
			}
		}
	})
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{"after": "crash"}))
	require.Equal(t, id, (<-crashed).String())

	wakes := s.wakesOf(run)
	require.Equal(t, "succeeded", wakes[0].Outcome)
	spent, ledger := s.spent()
	require.EqualValues(t, 1, spent, "one debit")
	require.EqualValues(t, 1, ledger)
	require.Equal(t, 1, s.count(`SELECT count(*) FROM workpool_work`), "one work item")
	require.EqualValues(t, 1, s.handler.calls.Load())
}

func TestSignalWaitsOutATemporalOutage(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	wf := s.workflowID()
	run := s.park(wf, "wake", 1, 0)
	s.proxy.setCut(true)

	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{}))
	w := s.eventually(id, "queued with attempts counting", func(w map[string]any) bool {
		return delivery(w)["state"] == "queued" && delivery(w)["attempts"].(float64) >= 3
	})
	require.Equal(t, "pending", w["status"])
	require.Equal(t, "succeeded", w["outcome"])
	require.NotEmpty(t, delivery(w)["last_error"])

	s.proxy.setCut(false)
	wakes := s.wakesOf(run)
	require.Len(t, wakes, 1)
	require.Equal(t, "succeeded", wakes[0].Outcome)
	s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })
}

func TestSignalToAWorkflowThatStartsLaterIsDelivered(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	wf := s.workflowID()
	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{}))
	s.eventually(id, "retrying a missing workflow", func(w map[string]any) bool {
		return w["outcome"] == "succeeded" && delivery(w)["attempts"].(float64) >= 2
	})
	run := s.park(wf, "wake", 1, 0)
	wakes := s.wakesOf(run)
	require.Equal(t, id, wakes[0].WakeupID)
	s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })
}

func TestSignalToAGoneWorkflowIsUndeliverableUntilRedelivered(t *testing.T) {
	s := newStack(t, func(o *stackOptions) { o.notFoundGrace = 300 * time.Millisecond })
	s.fund(10)
	wf := s.workflowID()
	id := s.createWakeup(wakeupBody(wf, "echo", map[string]any{}))
	w := s.eventually(id, "undeliverable", func(w map[string]any) bool { return w["status"] == "failed" })
	require.Equal(t, "undeliverable", delivery(w)["state"])
	require.Equal(t, "succeeded", w["outcome"])
	require.Contains(t, delivery(w)["last_error"], "not found")

	r := s.call(http.MethodPost, "/v1/wakeups/"+id+"/redeliver", token(t, org, "agent"), nil)
	require.Equal(t, http.StatusForbidden, r.status, "redeliver is for admins")
	run := s.park(wf, "wake", 1, 0)
	r = s.call(http.MethodPost, "/v1/wakeups/"+id+"/redeliver", token(t, org, "admin"), nil)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Equal(t, id, s.wakesOf(run)[0].WakeupID)
	s.eventually(id, "delivered", func(w map[string]any) bool { return w["status"] == "delivered" })

	r = s.call(http.MethodPost, "/v1/wakeups/"+id+"/redeliver", token(t, org, "admin"), nil)
	require.Equal(t, http.StatusConflict, r.status, "a delivered signal is not redelivered")
}

func TestAwaitWakeIgnoresDuplicatesOtherOrgsAndMalformedSignals(t *testing.T) {
	s := newStack(t)
	wf := s.workflowID()
	run := s.park(wf, "wake", 2, 0)
	ctx := context.Background()
	first := workflows.Wake{OrgID: org, WakeupID: "w1", Outcome: "succeeded"}
	// The wake that completes the workflow is sent last: a signal sent after
	// it would race the workflow's completion and fail with "workflow
	// execution already completed" whenever the worker wins.
	for _, sig := range []any{
		first,
		first, // a repeated delivery
		workflows.Wake{OrgID: otherOrg, WakeupID: "w-evil", Outcome: "succeeded"},
		"not a wake",
		workflows.Wake{OrgID: org, WakeupID: "w2", Outcome: "failed", Error: "x"},
	} {
		require.NoError(t, s.tc.SignalWorkflow(ctx, wf, "", "wake", sig))
	}
	wakes := s.wakesOf(run)
	require.Equal(t, []string{"w1", "w2"}, []string{wakes[0].WakeupID, wakes[1].WakeupID})
}

func TestAwaitWakeReportsATimeout(t *testing.T) {
	s := newStack(t)
	run := s.park(s.workflowID(), "wake", 1, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var wakes []workflows.Wake
	err := run.Get(ctx, &wakes)
	require.ErrorContains(t, err, workflows.ErrTimeout.Error())
}

func TestReferenceWorkflowRoundTrip(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	in := reference.Input{AgentID: agent, Signal: "wake", Scope: scope, Reason: "demo", Cost: 2,
		Work: wakeupWork("echo", `{"hello":"world"}`), Timeout: wait}
	var res reference.Result
	run, err := s.tc.ExecuteWorkflow(context.Background(), clientOptions(s, s.workflowID()), reference.WorkflowName, in)
	require.NoError(t, err)
	require.NoError(t, run.Get(context.Background(), &res))
	require.False(t, res.Refused)
	require.Equal(t, "succeeded", res.Wake.Outcome)
	require.JSONEq(t, `{"hello":"world"}`, string(res.Wake.Result))
	spent, _ := s.spent()
	require.EqualValues(t, 2, spent)

	t.Run("a refusal waits for the approval's wake", func(t *testing.T) {
		in.Cost = 100
		run, err := s.tc.ExecuteWorkflow(context.Background(), clientOptions(s, s.workflowID()), reference.WorkflowName, in)
		require.NoError(t, err)
		var approval string
		require.True(t, assertEventually(func() bool {
			r := s.call(http.MethodGet, "/v1/mandate-approvals?status=pending", token(t, org, "approver"), nil)
			items, _ := r.body["items"].([]any)
			if len(items) == 1 {
				approval = items[0].(map[string]any)["id"].(string)
			}
			return approval != ""
		}))
		r := s.call(http.MethodPost, "/v1/mandate-approvals/"+approval+"/deny", token(t, org, "approver"), nil)
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		var res reference.Result
		require.NoError(t, run.Get(context.Background(), &res))
		require.True(t, res.Refused)
		require.Equal(t, approval, res.ApprovalID)
		require.Equal(t, "denied", res.Wake.Outcome)
	})
}

func TestWakeupRequestsAreValidatedBeforeAnythingIsSpent(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	wf := s.workflowID()
	tok := token(t, org, "agent")
	cases := []struct {
		name, field string
		mutate      func(b map[string]any)
	}{
		{"empty workflow_id", "workflow_id", func(b map[string]any) { b["workflow_id"] = "" }},
		{"another org's workflow", "workflow_id", func(b map[string]any) { b["workflow_id"] = otherOrg + "/wf" }},
		{"org prefix without a separator", "workflow_id", func(b map[string]any) { b["workflow_id"] = org + "wf" }},
		{"empty signal", "signal", func(b map[string]any) { b["signal"] = "" }},
		{"empty handler", "work.handler", func(b map[string]any) { b["work"].(map[string]any)["handler"] = "" }},
		{"unknown handler", "work.handler", func(b map[string]any) { b["work"].(map[string]any)["handler"] = "nope" }},
		{"unknown pool", "pool", func(b map[string]any) { b["pool"] = "nope" }},
		{"negative cost", "cost", func(b map[string]any) { b["cost"] = -1 }},
		{"fractional cost", "cost", func(b map[string]any) { b["cost"] = 1.5 }},
		{"missing cost", "cost", func(b map[string]any) { delete(b, "cost") }},
		{"empty scope", "scope", func(b map[string]any) { b["scope"] = "" }},
		{"bad retry", "work.retry.max_attempts", func(b map[string]any) {
			b["work"].(map[string]any)["retry"] = map[string]any{"max_attempts": 0, "initial_backoff_ms": 1, "base": 2}
		}},
		{"unknown field", "surprise", func(b map[string]any) { b["surprise"] = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := wakeupBody(wf, "echo", map[string]any{})
			tc.mutate(b)
			r := s.call(http.MethodPost, "/v1/wakeups", tok, b)
			require.Equal(t, http.StatusBadRequest, r.status, string(r.raw))
			var fields []string
			for _, e := range r.body["errors"].([]any) {
				fields = append(fields, e.(map[string]any)["field"].(string))
			}
			require.Contains(t, fields, tc.field)
		})
	}
	spent, _ := s.spent()
	require.Zero(t, spent, "nothing spent")
	require.Zero(t, s.count(`SELECT count(*) FROM wakeups`), "nothing written")
	require.Zero(t, s.count(`SELECT count(*) FROM mandate_approvals`))
}

func TestWakeupsAreScopedToTheirOrgAndRoles(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	id := s.createWakeup(wakeupBody(s.workflowID(), "echo", map[string]any{}))
	for _, path := range []string{"/v1/wakeups/" + id, "/v1/wakeups/" + uuid.NewString(), "/v1/wakeups/not-a-uuid"} {
		r := s.call(http.MethodGet, path, token(t, otherOrg, "agent", "admin"), nil)
		require.Equal(t, http.StatusNotFound, r.status, path)
	}
	r := s.call(http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, otherOrg, "agent"), nil)
	require.Equal(t, http.StatusNotFound, r.status)
	r = s.call(http.MethodGet, "/v1/wakeups", token(t, otherOrg, "agent"), nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.body["items"])

	r = s.call(http.MethodPost, "/v1/wakeups", token(t, org, "admin"), wakeupBody(s.workflowID(), "echo", nil))
	require.Equal(t, http.StatusForbidden, r.status, "creating a wake-up needs the agent role")
	bound, err := signBound(org, "someone-else")
	require.NoError(t, err)
	r = s.call(http.MethodPost, "/v1/wakeups", bound, wakeupBody(s.workflowID(), "echo", nil))
	require.Equal(t, http.StatusForbidden, r.status, "a token bound to another agent")

	r = s.call(http.MethodGet, "/v1/wakeups?workflow_id="+s.workflowID(), token(t, org, "admin"), nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.body["items"])
	r = s.call(http.MethodGet, "/v1/wakeups?status=bogus", token(t, org, "admin"), nil)
	require.Equal(t, http.StatusBadRequest, r.status)
}

func TestIdempotentWakeupCreatesOneWakeupAndOneSpend(t *testing.T) {
	s := newStack(t)
	s.fund(10)
	body := wakeupBody(s.workflowID(), "echo", map[string]any{})
	tok := token(t, org, "agent")
	const n = 6
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.call(http.MethodPost, "/v1/wakeups", tok, body, "Idempotency-Key", "same-key")
			if r.status == http.StatusCreated {
				ids[i] = r.body["id"].(string)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	require.Equal(t, 1, s.count(`SELECT count(*) FROM wakeups`))
	spent, _ := s.spent()
	require.EqualValues(t, 1, spent)
	require.True(t, assertEventually(func() bool { return s.count(`SELECT count(*) FROM workpool_work`) == 1 }))
}

func TestReadyzStaysReadyWhileTemporalIsDown(t *testing.T) {
	s := newStack(t)
	r := s.call(http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	s.proxy.setCut(true)
	// Still ready: work is accepted and its signals wait in the outbox.
	r = s.call(http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	require.Contains(t, r.body["checks"].(map[string]any)["temporal"], "down: ")
	s.proxy.setCut(false)
	require.True(t, assertEventually(func() bool {
		r := s.call(http.MethodGet, "/readyz", "", nil)
		checks, _ := r.body["checks"].(map[string]any)
		return r.status == http.StatusOK && checks["temporal"] == "ok"
	}))
}
