package workpool

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// attemptResult is how one attempt ended, as an executor (or recovery)
// reports it.
type attemptResult struct {
	id        uuid.UUID
	pool      string
	attempt   int // 1-based
	succeeded bool
	result    json.RawMessage
	err       string
	retryable bool
}

// hookCall is a finished item whose onComplete hook must run.
type hookCall struct {
	c        Completion
	hook     string
	attempts int // hook calls already made and failed
}

// finishedRow is a row RETURNING from the statements that finish work.
type finishedRow struct {
	id       uuid.UUID
	orgID    string
	pool     string
	handler  string
	state    string
	outcome  *string
	result   json.RawMessage
	errText  *string
	attempts int32
	hook     *string
	hookCtx  json.RawMessage
}

func scanFinished(rows pgx.Rows) ([]finishedRow, error) {
	defer rows.Close()
	var out []finishedRow
	for rows.Next() {
		var r finishedRow
		if err := rows.Scan(&r.id, &r.orgID, &r.pool, &r.handler, &r.state, &r.outcome, &r.result, &r.errText,
			&r.attempts, &r.hook, &r.hookCtx); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// hookCalls picks the rows that finished and have a hook.
func hookCalls(rows []finishedRow) []hookCall {
	var calls []hookCall
	for _, r := range rows {
		if r.state != "finished" || r.hook == nil {
			continue
		}
		c := Completion{WorkID: r.id, OrgID: r.orgID, Pool: r.pool, Handler: r.handler, Attempts: int(r.attempts),
			Result: r.result, Context: r.hookCtx}
		if r.outcome != nil {
			c.Outcome = Outcome(*r.outcome)
		}
		if r.errText != nil {
			c.Error = *r.errText
		}
		calls = append(calls, hookCall{c: c, hook: *r.hook})
	}
	return calls
}

// completeTx records a batch of attempt results in tx (one statement),
// wakes the loops of the pools involved, and runs the hooks of the work that
// finished. A duplicate or stale result changes nothing and runs no hook.
func (m *Manager) completeTx(ctx context.Context, tx pgx.Tx, results []attemptResult) ([]finishedRow, error) {
	if len(results) == 0 {
		return nil, nil
	}
	n := len(results)
	ids, attempts := make([]uuid.UUID, n), make([]int32, n)
	kinds, res, errs, retryable := make([]string, n), make([]*string, n), make([]string, n), make([]bool, n)
	pools := map[string]bool{}
	for i, r := range results {
		ids[i], attempts[i], errs[i], retryable[i] = r.id, int32(r.attempt), r.err, r.retryable
		kinds[i] = "failed"
		if r.succeeded {
			kinds[i] = "succeeded"
			s := "null"
			if len(r.result) > 0 {
				s = string(r.result)
			}
			res[i] = &s
		}
		pools["k:"+r.pool+"@"+m.origin] = true
	}
	kicks := make([]string, 0, len(pools))
	for p := range pools {
		kicks = append(kicks, p)
	}
	b := &pgx.Batch{}
	b.Queue(sqlComplete, ids, attempts, kinds, res, errs, retryable, m.now())
	b.Queue(sqlNotifyEach, kicks)
	br := tx.SendBatch(ctx, b)
	rows, err := br.Query()
	var done []finishedRow
	if err == nil {
		done, err = scanFinished(rows)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("completing %d attempts: %w", n, err)
	}
	if err := m.runHooks(ctx, tx, hookCalls(done), false); err != nil {
		return nil, err
	}
	return done, nil
}

// runHooks calls hooks inside tx, one savepoint for the whole batch; when a
// hook fails the batch is bisected so that every hook that can succeed
// does, and each failing call is scheduled for a retry. The completion
// commits either way. retrying says the calls come from the retry queue
// (successes must then be marked done).
func (m *Manager) runHooks(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying bool) error {
	if len(calls) == 0 {
		return nil
	}
	failed := map[uuid.UUID]error{}
	if err := m.hookBatch(ctx, tx, calls, failed); err != nil {
		return err
	}
	var okIDs, badIDs []uuid.UUID
	var nextAts []time.Time
	var msgs []string
	now := m.now()
	for _, c := range calls {
		herr, bad := failed[c.c.WorkID]
		m.metrics.hookCalls.WithLabelValues(c.c.Pool, hookResult(bad)).Inc()
		if !bad {
			okIDs = append(okIDs, c.c.WorkID)
			continue
		}
		badIDs = append(badIDs, c.c.WorkID)
		nextAts = append(nextAts, now.Add(m.hookBackoff(c.attempts+1)))
		msgs = append(msgs, herr.Error())
		m.logger.Warn("onComplete hook failed; will retry", "hook", c.hook, "work_id", c.c.WorkID.String(),
			"org_id", c.c.OrgID, "attempt", c.attempts+1, "error", herr.Error())
	}
	if len(badIDs) > 0 {
		if _, err := tx.Exec(ctx, sqlHookFailed, badIDs, nextAts, msgs); err != nil {
			return fmt.Errorf("scheduling hook retries: %w", err)
		}
	}
	if retrying && len(okIDs) > 0 {
		if _, err := tx.Exec(ctx, sqlHookDone, okIDs); err != nil {
			return fmt.Errorf("recording hook calls: %w", err)
		}
	}
	return nil
}

func hookResult(failed bool) string {
	if failed {
		return "failed"
	}
	return "ok"
}

// hookBatch runs calls in one savepoint; on a failure it rolls back and
// retries the calls before the failing one together, the failing one alone,
// and the rest recursively. Only database errors end it early.
func (m *Manager) hookBatch(ctx context.Context, tx pgx.Tx, calls []hookCall, failed map[uuid.UUID]error) error {
	if len(calls) == 0 {
		return nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("hook savepoint: %w", err)
	}
	bad, herr := -1, error(nil)
	for i, c := range calls {
		if herr = m.callHook(ctx, sp, c); herr != nil {
			bad = i
			break
		}
	}
	if bad < 0 {
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("hook savepoint release: %w", err)
		}
		return nil
	}
	if err := sp.Rollback(ctx); err != nil {
		return fmt.Errorf("hook savepoint rollback: %w", err)
	}
	if len(calls) == 1 {
		failed[calls[0].c.WorkID] = herr
		return nil
	}
	if err := m.hookBatch(ctx, tx, calls[:bad], failed); err != nil {
		return err
	}
	if err := m.hookBatch(ctx, tx, calls[bad:bad+1], failed); err != nil {
		return err
	}
	return m.hookBatch(ctx, tx, calls[bad+1:], failed)
}

// callHook runs one hook, turning a panic into an error.
func (m *Manager) callHook(ctx context.Context, tx pgx.Tx, c hookCall) (err error) {
	h, ok := m.hook(c.hook)
	if !ok {
		return fmt.Errorf("hook %q is not registered on this replica", c.hook)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("hook %q panicked: %v", c.hook, r)
		}
	}()
	if err := h(ctx, tx, c.c); err != nil {
		return fmt.Errorf("hook %q: %w", c.hook, err)
	}
	return nil
}

// hookBackoff is the wait before hook call n+1 (n ≥ 1): doubling from
// HookRetryBackoff, at most 5 minutes.
func (m *Manager) hookBackoff(n int) time.Duration {
	d := m.cfg.HookRetryBackoff
	for i := 1; i < n && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}
