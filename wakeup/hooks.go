package wakeup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workpool"
)

type queueSignal = queue.Signal

// enqueueSignal queues the wake signal; the wake-up id is the message's
// idempotency key, so an intent has at most one signal. In the pool's
// onComplete hook, with a local dispatcher, the signal is handed to that
// dispatcher once the hook's transaction commits: no NOTIFY and no claim on
// the wake's path (a lost handoff is sent by any dispatcher after its
// lease). Elsewhere (an approval's resolve hook, a cancel) it is queued for
// any replica's dispatcher, which NOTIFY wakes.
func (s *Service) enqueueSignal(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, payload json.RawMessage, sig *queue.Signal) error {
	p := queue.EnqueueParams{OrgID: orgID, Queue: Queue, Payload: payload, IdempotencyKey: id.String(), Signal: sig}
	if d := s.cfg.Dispatcher; d != nil {
		// Registering first is how to learn whether ctx is a hook's; h is
		// set by the time the commit runs the callback (nil: nothing to hand
		// over, the message existed or the dispatcher is stopped).
		var h *queue.Handoff
		if workpool.AfterCommit(ctx, func() {
			if h != nil {
				d.Handoff(h)
			}
		}) {
			var err error
			if _, h, err = d.EnqueueForHandoff(ctx, tx, p); err != nil {
				return fmt.Errorf("queue wake signal: %w", err)
			}
			return nil
		}
	}
	if _, _, err := queue.Enqueue(ctx, tx, p); err != nil {
		return fmt.Errorf("queue wake signal: %w", err)
	}
	return nil
}

// onWorkComplete is the workpool onComplete hook: in the completing
// transaction it records the outcome and queues the signal.
func (s *Service) onWorkComplete(ctx context.Context, tx pgx.Tx, c workpool.Completion) error {
	var hc hookContext
	if err := json.Unmarshal(c.Context, &hc); err != nil {
		return fmt.Errorf("wakeup hook: bad context %q: %w", c.Context, err)
	}
	if hc.OrgID != c.OrgID {
		return fmt.Errorf("wakeup hook: context org %q differs from the work's org %q", hc.OrgID, c.OrgID)
	}
	s.logger.DebugContext(ctx, "wake-up's work finished", "org_id", c.OrgID, "wakeup_id", hc.WakeupID, "outcome", string(c.Outcome))
	errText := c.Error
	if c.Outcome == workpool.OutcomeCanceled && errText == "" {
		// (the pool keeps no error of canceled work; a Wake says why, as
		// the cancels before the work was enqueued do)
		errText = "canceled after its work was enqueued"
	}
	_, err := s.resolveTx(ctx, tx, c.OrgID, hc.WakeupID, string(c.Outcome), c.Result, errText)
	return err
}

// onApprovalResolved is the mandates resolve hook. Approval funds the intent
// and enqueues its work in the resolving transaction; denial and expiry
// wake the workflow with "denied".
func (s *Service) onApprovalResolved(ctx context.Context, tx pgx.Tx, r mandates.Resolution) error {
	var data resolveData
	if err := json.Unmarshal(r.Payload.Data, &data); err != nil {
		return fmt.Errorf("wakeup resolve hook: bad payload: %w", err)
	}
	switch r.State {
	case mandates.StateApproved:
		tag, err := tx.Exec(ctx, `UPDATE wakeups SET state = 'funded', updated_at = now()
			WHERE org_id = $1 AND id = $2 AND state = 'awaiting_approval'`, r.OrgID, data.WakeupID)
		if err != nil {
			return fmt.Errorf("fund approved wake-up: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil // canceled meanwhile: nothing to run
		}
		s.logger.DebugContext(ctx, "wake-up's spend approved, funded", "org_id", r.OrgID, "wakeup_id", data.WakeupID)
		_, err = s.enqueueFundedTx(ctx, tx, r.OrgID, data.WakeupID, false)
		var inv *apperr.InvalidError
		if errors.As(err, &inv) {
			// The work can never run (its pool or handler is gone): the
			// approval stands, the charge is refunded, the workflow wakes.
			return s.failUnenqueueableTx(ctx, tx, r.OrgID, data.WakeupID, err.Error())
		}
		return err
	default: // denied, expired
		errText := "spend " + r.State
		if r.Note != "" {
			errText += ": " + r.Note
		}
		_, err := s.resolveTx(ctx, tx, r.OrgID, data.WakeupID, OutcomeDenied, nil, errText)
		return err
	}
}

// Cancel cancels a wake-up: its work (the pool then finishes it as
// canceled and the hook wakes the workflow), or its pending approval
// request, or — between the two transactions — the funded intent, whose
// spend is refunded. A settled wake-up is left alone. agentID narrows it to
// that agent's wake-ups as in Get.
func (s *Service) Cancel(ctx context.Context, orgID, agentID string, id uuid.UUID) (Wakeup, error) {
	// (what the cancel counts — a request withdrawn, a wake-up resolved —
	// counts once it commits)
	ctx, committed := db.WithAfterCommit(ctx)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var state string
		var approvalID, enqueuedWork *uuid.UUID
		err := tx.QueryRow(ctx, `SELECT state, approval_id, work_id FROM wakeups WHERE org_id = $1 AND id = $2 AND ($3 = '' OR agent_id = $3)`,
			orgID, id, agentID).Scan(&state, &approvalID, &enqueuedWork)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("read wake-up: %w", err)
		}
		// An approval request is withdrawn before the intent is locked: the
		// resolving transaction of an approval takes the two rows in that
		// order too, so the two never deadlock. If the approval won the
		// race, the intent is enqueued by now and its work is canceled below.
		if state == stateAwaitingApproval {
			if _, err := s.mandates.CancelApprovalTx(ctx, tx, orgID, *approvalID); err != nil {
				return err
			}
		}
		if state == stateEnqueued && enqueuedWork != nil {
			// Only the work's hook moves it on from here, and canceling
			// finished work is a no-op: no lock on the wake-up, which the
			// hook takes inside the pool's transaction (after the pool's
			// cancelation row: the other order would let two cancels and
			// the loop deadlock).
			return s.pool.CancelTx(ctx, tx, orgID, *enqueuedWork)
		}
		var agent, scope string
		var cost int64
		var workID *uuid.UUID
		err = tx.QueryRow(ctx, `SELECT state, work_id, agent_id, scope, cost FROM wakeups
			WHERE org_id = $1 AND id = $2 FOR UPDATE`, orgID, id).Scan(&state, &workID, &agent, &scope, &cost)
		if err != nil {
			return fmt.Errorf("lock wake-up: %w", err)
		}
		switch state {
		case stateAwaitingApproval:
			_, err = s.resolveTx(ctx, tx, orgID, id, OutcomeCanceled, nil, "canceled while awaiting approval")
			return err
		case stateFunded:
			if err := s.mandates.RefundTx(ctx, tx, orgID, agent, scope, cost, "wake-up canceled before its work was enqueued", "wakeup-refund:"+id.String()); err != nil {
				return err
			}
			_, err = s.resolveTx(ctx, tx, orgID, id, OutcomeCanceled, nil, "canceled before its work was enqueued")
			return err
		case stateEnqueued:
			return s.pool.CancelTx(ctx, tx, orgID, *workID)
		}
		return nil // resolved: a no-op
	})
	if err != nil {
		return Wakeup{}, err
	}
	committed.Run()
	s.logger.DebugContext(ctx, "wake-up canceled", "org_id", orgID, "wakeup_id", id)
	return s.Get(ctx, orgID, AnyAgent, id)
}

// Redeliver re-queues an undeliverable wake signal. agentID narrows it to
// that agent's wake-ups as in Get.
func (s *Service) Redeliver(ctx context.Context, orgID, agentID string, id uuid.UUID) (Wakeup, error) {
	w, err := s.Get(ctx, orgID, agentID, id)
	if err != nil {
		return Wakeup{}, err
	}
	if w.Delivery.State != DeliveryUndeliverable {
		return w, ErrNotUndeliverable
	}
	if err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error { return RedeliverTx(ctx, tx, orgID, id) }); err != nil {
		if errors.Is(err, ErrNotUndeliverable) {
			return w, err
		}
		return Wakeup{}, err
	}
	return s.Get(ctx, orgID, AnyAgent, id)
}

// RedeliverTx re-queues the undeliverable signal of wake-up id in tx. It
// writes the wake-up row first: retention deletes an old wake-up whose
// signal is not pending, and the write both holds off a purge under way
// (it skips locked rows) and makes one whose snapshot predates this
// transaction re-read the row and find it young. A wake-up already purged
// is ErrNotFound, and the signal is left as it is.
func RedeliverTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID) error {
	tag, err := tx.Exec(ctx, `UPDATE wakeups SET updated_at = now() WHERE org_id = $1 AND id = $2`, orgID, id)
	if err != nil {
		return fmt.Errorf("lock wake-up: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	msg, err := queue.GetByKey(ctx, tx, orgID, Queue, id.String())
	if err != nil {
		return err
	}
	if ok, err := queue.Redeliver(ctx, tx, orgID, msg.ID); err != nil {
		return err
	} else if !ok {
		return ErrNotUndeliverable
	}
	return nil
}

// failUnenqueueableTx settles an intent whose work can never be enqueued:
// its spend is refunded and its workflow woken with "failed".
func (s *Service) failUnenqueueableTx(ctx context.Context, tx pgx.Tx, orgID string, id uuid.UUID, cause string) error {
	var agent, scope string
	var cost int64
	if err := tx.QueryRow(ctx, `SELECT agent_id, scope, cost FROM wakeups WHERE org_id = $1 AND id = $2`, orgID, id).Scan(&agent, &scope, &cost); err != nil {
		return fmt.Errorf("read wake-up: %w", err)
	}
	if err := s.mandates.RefundTx(ctx, tx, orgID, agent, scope, cost, "wake-up work could not be enqueued", "wakeup-refund:"+id.String()); err != nil {
		return err
	}
	_, err := s.resolveTx(ctx, tx, orgID, id, OutcomeFailed, nil, "work could not be enqueued: "+cause)
	return err
}

// reconcileRound is one round of the leader's loop: enqueue funded intents
// that no transaction enqueued (a crash or error between the gate and the
// enqueue).
func (s *Service) reconcileRound(ctx context.Context) error {
	n, err := s.Reconcile(ctx)
	if n > 0 {
		s.logger.Info("reconciled funded wake-ups", "count", n)
	}
	return err
}

// Reconcile enqueues the work of every funded intent older than
// ReconcileAfter; an intent whose work can never be enqueued (its pool or
// handler is gone) is refunded and its workflow woken with "failed". It
// returns how many intents it settled. The reconciler calls it with its
// leadership's term in ctx, which fences each transaction: once another
// replica has taken the leadership, Reconcile writes nothing and returns
// leader.ErrDeposed. Tests and tools may call it without a term.
func (s *Service) Reconcile(ctx context.Context) (int, error) {
	// Spans every org: the reconciler is a system maintenance loop; each
	// intent is then handled with its own org.
	fctx, cancel := context.WithTimeout(ctx, leader.StatementTimeout) // (see leader.StatementTimeout)
	defer cancel()
	rows, err := s.db.Query(fctx, `SELECT org_id, id FROM wakeups WHERE state = 'funded' AND updated_at < now() - $1::interval
		ORDER BY updated_at LIMIT 500`, s.cfg.ReconcileAfter)
	if err != nil {
		return 0, fmt.Errorf("find funded wake-ups: %w", err)
	}
	type intent struct {
		org string
		id  uuid.UUID
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (intent, error) {
		var i intent
		return i, r.Scan(&i.org, &i.id)
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, i := range due {
		done, err := s.reconcileOne(ctx, i.org, i.id)
		if errors.Is(err, leader.ErrDeposed) {
			return n, err // every other intent would meet it too
		}
		if err != nil && ctx.Err() != nil {
			return n, ctx.Err() // stopping or deposed: not the intent's failure
		}
		if err != nil {
			s.metrics.reconcileErrs.Inc()
			s.logger.Error("reconciling a funded wake-up failed", "org_id", i.org, "wakeup_id", i.id, "error", err)
			continue
		}
		if done {
			n++
			s.metrics.reconciled.Inc()
		}
	}
	return n, nil
}

func (s *Service) reconcileOne(ctx context.Context, orgID string, id uuid.UUID) (bool, error) {
	var done bool
	err := leader.FencedTx(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		done, err = s.enqueueFundedTx(ctx, tx, orgID, id, true)
		return err
	})
	if err == nil {
		return done, nil
	}
	var inv *apperr.InvalidError
	if !errors.As(err, &inv) {
		return false, err
	}
	// The work can never be enqueued: refund and wake the workflow.
	cause := err.Error()
	s.logger.Warn("funded wake-up cannot be enqueued; refunding and waking its workflow with failed", "org_id", orgID, "wakeup_id", id, "error", err)
	err = leader.FencedTx(ctx, s.db, func(tx pgx.Tx) error {
		var still bool
		err := tx.QueryRow(ctx, `SELECT true FROM wakeups WHERE org_id = $1 AND id = $2 AND state = 'funded' FOR UPDATE SKIP LOCKED`,
			orgID, id).Scan(&still)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		done = true
		return s.failUnenqueueableTx(ctx, tx, orgID, id, cause)
	})
	return done, err
}
