package workpool

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/jsonb"
)

// onComplete hooks run inside the transaction that finishes their work
// (docs/workpool.md § "The life of an attempt").

const (
	sqlSavepoint         = "SAVEPOINT workpool_hooks"
	sqlRollbackSavepoint = "ROLLBACK TO SAVEPOINT workpool_hooks"
	// sqlHookStatementTimeout bounds every later statement of the
	// transaction — a hook's among them — to $1 ms, and returns the bound
	// it replaces. It is set before the hooks' savepoint, so that rolling
	// back to it keeps the bound.
	sqlHookStatementTimeout = "SELECT current_setting('statement_timeout'), set_config('statement_timeout', $1, true)"
	// sqlRestoreStatementTimeout puts back the bound the transaction had
	// before the hooks' ($1, as sqlHookStatementTimeout returned it): in
	// the loop's transaction the starts follow the hooks, and a start
	// bounded by a short hook timeout would fail the iteration.
	sqlRestoreStatementTimeout = "SELECT set_config('statement_timeout', $1, true)"
)

// hookTimeoutSlack is how much longer a hook call's context lasts than its
// statements may: a statement past the bound fails on the server, which
// leaves the transaction usable from the savepoint on, while a context
// that ends mid-statement closes the connection, and the transaction with
// it.
const hookTimeoutSlack = time.Second

// hookStatementTimeout is HookTimeout as sqlHookStatementTimeout's
// parameter.
func (m *Manager) hookStatementTimeout() string {
	return strconv.FormatInt(max(m.cfg.HookTimeout.Milliseconds(), 1), 10)
}

// runHooks calls hooks inside tx, one savepoint for the whole batch; when a
// hook fails the batch is bisected so that every hook that can succeed
// does, and each failing call is scheduled for a retry. The completion
// commits either way. retrying says the calls come from the retry queue
// (successes must then be marked done); open says the savepoint was just
// set, and the statement timeout before it (completeIn does both, and
// puts the timeout back). Otherwise runHooks sets both, and leaves the
// transaction's statement timeout as it found it.
func (m *Manager) runHooks(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying, open bool) error {
	if len(calls) == 0 {
		return nil
	}
	if open {
		return m.runHooksBounded(ctx, tx, calls, retrying, true)
	}
	var before string
	if err := tx.QueryRow(ctx, sqlHookStatementTimeout, m.hookStatementTimeout()).Scan(&before, nil); err != nil {
		return fmt.Errorf("hook statement timeout: %w", err)
	}
	if err := m.runHooksBounded(ctx, tx, calls, retrying, false); err != nil {
		return err
	}
	return restoreStatementTimeout(ctx, tx, before)
}

// restoreStatementTimeout puts back the statement timeout a transaction
// had before the hooks' bound.
func restoreStatementTimeout(ctx context.Context, tx pgx.Tx, before string) error {
	if _, err := tx.Exec(ctx, sqlRestoreStatementTimeout, before); err != nil {
		return fmt.Errorf("restoring the statement timeout after hooks: %w", err)
	}
	return nil
}

// runHooksBounded is runHooks once the hooks' statement timeout is set.
func (m *Manager) runHooksBounded(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying, open bool) error {
	failed := map[uuid.UUID]error{}
	if err := m.hookBatch(ctx, tx, calls, failed, open); err != nil {
		return err
	}
	var okIDs, badIDs []uuid.UUID
	var nextAts []time.Time
	var msgs []string
	now := m.now()
	counts := make(map[[2]string]int)
	// (a completion whose commit fails is recorded again, and its hooks
	// called again)
	defer db.CountAfterCommit(ctx, func() {
		for k, n := range counts {
			m.metrics.hookCalls.WithLabelValues(k[0], k[1]).Add(float64(n))
		}
	})
	for _, c := range calls {
		herr, bad := failed[c.c.WorkID]
		counts[[2]string{c.c.Pool, hookResult(bad)}]++
		if !bad {
			okIDs = append(okIDs, c.c.WorkID)
			continue
		}
		badIDs = append(badIDs, c.c.WorkID)
		nextAts = append(nextAts, now.Add(m.hookBackoff(c.attempts+1)))
		// A hook's error may quote NUL or bytes that are not UTF-8, which
		// would fail sqlHookFailed at every retry.
		msgs = append(msgs, jsonb.Text(herr.Error()))
		m.logger.Warn("onComplete hook failed; will retry", "hook", c.hook, "work_id", c.c.WorkID.String(),
			"org_id", c.c.OrgID, "pool", c.c.Pool, "attempt", c.attempts+1, "error", herr.Error())
	}
	if len(badIDs) > 0 {
		if _, err := tx.Exec(ctx, sqlHookFailed, pgUUIDs(badIDs), nextAts, msgs); err != nil {
			return fmt.Errorf("scheduling hook retries: %w", err)
		}
	}
	if retrying && len(okIDs) > 0 {
		if _, err := tx.Exec(ctx, sqlHookDone, pgUUIDs(okIDs)); err != nil {
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

// hookBatch runs calls under one savepoint (set now unless open); on a
// failure it rolls back to it and retries the calls before the failing one
// together, the failing one alone, and the rest recursively. Only database
// errors end it early. A successful batch needs no RELEASE: the commit
// keeps its work.
func (m *Manager) hookBatch(ctx context.Context, tx pgx.Tx, calls []hookCall, failed map[uuid.UUID]error, open bool) error {
	if len(calls) == 0 {
		return nil
	}
	if !open {
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return fmt.Errorf("hook savepoint: %w", err)
		}
	}
	htx := hookTx{Tx: tx}
	// What the hooks register to run after the commit is kept only if this
	// savepoint is.
	hctx, actions := db.WithAfterCommit(ctx)
	bad, herr := -1, error(nil)
	for i, c := range calls {
		if herr = m.callHook(hctx, htx, c); herr != nil {
			bad = i
			break
		}
	}
	if bad < 0 {
		actions.KeepIn(ctx)
		return nil
	}
	if _, err := tx.Exec(ctx, sqlRollbackSavepoint); err != nil {
		return fmt.Errorf("hook savepoint rollback: %w", err)
	}
	if len(calls) == 1 {
		failed[calls[0].c.WorkID] = herr
		return nil
	}
	if err := m.hookBatch(ctx, tx, calls[:bad], failed, true); err != nil {
		return err
	}
	if err := m.hookBatch(ctx, tx, calls[bad:bad+1], failed, false); err != nil {
		return err
	}
	return m.hookBatch(ctx, tx, calls[bad+1:], failed, false)
}

// hookTx is the transaction a hook sees: everything but ending it.
type hookTx struct{ pgx.Tx }

var errHookEndsTx = errors.New("an onComplete hook must not commit or roll back the completing transaction; return an error instead")

func (hookTx) Commit(context.Context) error   { return errHookEndsTx }
func (hookTx) Rollback(context.Context) error { return errHookEndsTx }

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
	hctx, cancel := context.WithTimeout(ctx, m.cfg.HookTimeout+hookTimeoutSlack)
	defer cancel()
	if err := h(hctx, tx, c.c); err != nil {
		if errors.Is(hctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("hook %q did not return within the hook timeout (%s): %w", c.hook, m.cfg.HookTimeout, err)
		}
		return fmt.Errorf("hook %q: %w", c.hook, err)
	}
	if tx.Conn().PgConn().TxStatus() == 'E' {
		// It swallowed a database error: the transaction can only roll back.
		return fmt.Errorf("hook %q returned no error but left the transaction failed (a database error was ignored)", c.hook)
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
