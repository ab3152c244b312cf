package workpool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/jsonb"
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
	hook      bool // the work has an onComplete hook (as claimed)
}

// pgUUIDs converts ids for array parameters: as [16]byte pgx encodes them
// directly, where uuid.UUID would go element by element through
// driver.Valuer (a measurable share of a report's CPU).
func pgUUIDs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
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

// completeTx records a batch of attempt results in tx (one statement) and
// runs the hooks of the work that finished, in the same round trip as the
// statement when any result may need one. A duplicate or stale result
// changes nothing and runs no hook. Waking the loops is the caller's job,
// after commit (see wakeLoops), so that no NOTIFY lock is held across the
// commit's flush.
func (m *Manager) completeTx(ctx context.Context, tx pgx.Tx, results []attemptResult) ([]finishedRow, error) {
	return m.completeIn(ctx, tx, results, false)
}

// completeIn is completeTx; with begin, the batch opens tx's transaction
// itself (a connTx not yet begun), which saves a round trip.
func (m *Manager) completeIn(ctx context.Context, tx pgx.Tx, results []attemptResult, begin bool) ([]finishedRow, error) {
	if len(results) == 0 {
		return nil, nil
	}
	n := len(results)
	b := &pgx.Batch{}
	if begin {
		b.Queue("BEGIN")
	}
	b.Queue(sqlComplete, m.completeArgs(results)...)
	b.Queue(sqlSavepoint) // cheap, and saves a round trip before the hooks
	br := tx.SendBatch(ctx, b)
	var err error
	if begin {
		_, err = br.Exec()
	}
	var done []finishedRow
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			done, err = scanFinished(rows)
		}
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
	if err := m.runHooks(ctx, tx, hookCalls(done), false, true); err != nil {
		return nil, err
	}
	return done, nil
}

// completeArgs are sqlComplete's arrays for results.
func (m *Manager) completeArgs(results []attemptResult) []any {
	results = byID(results)
	n := len(results)
	ids, attempts := make([]uuid.UUID, n), make([]int32, n)
	kinds, res, errs, retryable := make([]string, n), make([]*string, n), make([]string, n), make([]bool, n)
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
	}
	return []any{pgUUIDs(ids), attempts, kinds, res, errs, retryable, m.now()}
}

// byID returns results sorted by work id (a sorted copy): statements that
// update a batch of work rows, and may wait for their locks, then take
// them in the order of the primary key, as the loop's do, rather than
// deadlock with them.
func byID(results []attemptResult) []attemptResult {
	if slices.IsSortedFunc(results, compareByID) {
		return results
	}
	sorted := slices.Clone(results)
	slices.SortFunc(sorted, compareByID)
	return sorted
}

func compareByID(a, b attemptResult) int { return bytes.Compare(a.id[:], b.id[:]) }

// releaseArgs are sqlRelease's arrays (the first ones of sqlComplete) for
// results: id, attempt, kind, retryable.
func releaseArgs(results []attemptResult) (ids [][16]byte, attempts []int32, kinds []string, retryable []bool) {
	results = byID(results)
	n := len(results)
	ids, attempts, kinds, retryable = make([][16]byte, n), make([]int32, n), make([]string, n), make([]bool, n)
	for i, r := range results {
		ids[i], attempts[i], retryable[i] = r.id, int32(r.attempt), r.retryable
		kinds[i] = "failed"
		if r.succeeded {
			kinds[i] = "succeeded"
		}
	}
	return ids, attempts, kinds, retryable
}

// releaseSlots runs sqlRelease for results in one round trip, without
// waiting for the WAL flush.
func (m *Manager) releaseSlots(ctx context.Context, results []attemptResult) error {
	ids, attempts, kinds, retryable := releaseArgs(results)
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
	b.Queue(sqlRelease, ids, attempts, kinds, retryable, m.now())
	if err := m.db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("releasing %d slots: %w", len(results), err)
	}
	return nil
}

// completeNoHooks records results of work without hooks in one implicit
// transaction: one round trip.
func (m *Manager) completeNoHooks(ctx context.Context, results []attemptResult) error {
	rows, err := m.db.Query(ctx, sqlComplete, m.completeArgs(results)...)
	if err != nil {
		return fmt.Errorf("completing %d attempts: %w", len(results), err)
	}
	done, err := scanFinished(rows)
	if err != nil {
		return fmt.Errorf("completing %d attempts: %w", len(results), err)
	}
	if calls := hookCalls(done); len(calls) > 0 {
		// Cannot happen: a hook is set at enqueue and reported at claim.
		m.logger.Error("completed work with a hook outside a hook transaction", "work_id", calls[0].c.WorkID.String())
	}
	return nil
}

// wakeLoops tells the loops of pools that they have completions: directly
// when this replica leads the pool, else by a NOTIFY in its own (write-free,
// so flush-free) transaction.
func (m *Manager) wakeLoops(ctx context.Context, pools map[string]bool) {
	var remote []string
	for p := range pools {
		if l := m.loopFor(p); l != nil && l.leading.Load() {
			l.kick(false)
			continue
		}
		remote = append(remote, "k:"+p+"@"+m.origin)
	}
	if len(remote) == 0 {
		return
	}
	if _, err := m.db.Exec(ctx, sqlNotifyEach, remote); err != nil && ctx.Err() == nil {
		// The loop still finds the completions at its next wake-up (its
		// recovery timer runs while slots are in use).
		m.logger.Warn("waking pool loops failed", "error", err.Error())
	}
}

const (
	sqlSavepoint         = "SAVEPOINT workpool_hooks"
	sqlRollbackSavepoint = "ROLLBACK TO SAVEPOINT workpool_hooks"
)

// runHooks calls hooks inside tx, one savepoint for the whole batch; when a
// hook fails the batch is bisected so that every hook that can succeed
// does, and each failing call is scheduled for a retry. The completion
// commits either way. retrying says the calls come from the retry queue
// (successes must then be marked done); open says the savepoint was just
// set.
func (m *Manager) runHooks(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying, open bool) error {
	if len(calls) == 0 {
		return nil
	}
	failed := map[uuid.UUID]error{}
	if err := m.hookBatch(ctx, tx, calls, failed, open); err != nil {
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
		// A hook's error may quote NUL or bytes that are not UTF-8, which
		// would fail sqlHookFailed at every retry.
		msgs = append(msgs, jsonb.Text(herr.Error()))
		m.logger.Warn("onComplete hook failed; will retry", "hook", c.hook, "work_id", c.c.WorkID.String(),
			"org_id", c.c.OrgID, "attempt", c.attempts+1, "error", herr.Error())
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
	hctx, actions := withCommitActions(ctx)
	bad, herr := -1, error(nil)
	for i, c := range calls {
		if herr = m.callHook(hctx, htx, c); herr != nil {
			bad = i
			break
		}
	}
	if bad < 0 {
		actions.keepIn(ctx)
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
	if err := h(ctx, tx, c.c); err != nil {
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
