package workpool

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// back to it keeps the bound. It also lets the transaction sit idle
	// for $2 ms (idleLimitWithHooks) where the session's own bound
	// (db.IdleInTransaction) would end it sooner while a hook waits in Go;
	// it never sets a bound on a session without one (0: a library user's
	// pool), where a hook that ignores its context and blocks outside the
	// database fails at its timeout once it returns — under a bound the
	// server would end the record, and every retry of it.
	sqlHookStatementTimeout = `SELECT current_setting('statement_timeout'), set_config('statement_timeout', $1, true),
  set_config('idle_in_transaction_session_timeout', CASE WHEN s.idle = interval '0' THEN '0'
    ELSE greatest(extract(epoch FROM s.idle) * 1000, $2::bigint)::bigint::text END, true)
FROM (SELECT current_setting('idle_in_transaction_session_timeout')::interval AS idle) s`
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

// hookBounds are sqlHookStatementTimeout's parameters: HookTimeout and
// idleLimitWithHooks, in ms.
func (m *Manager) hookBounds() []any {
	return []any{strconv.FormatInt(max(m.cfg.HookTimeout.Milliseconds(), 1), 10),
		strconv.FormatInt(m.idleLimitWithHooks().Milliseconds(), 10)}
}

// runHooks calls hooks inside tx, one savepoint for the whole batch; when a
// hook fails the batch is bisected so that every hook that can succeed
// does, and each failing call is scheduled for a retry. The completion
// commits either way. retrying says the calls come from the retry queue
// (successes must then be marked done); open says the savepoint was just
// set, and the statement timeout before it (completeIn does both, and
// puts the timeout back). Otherwise runHooks sets both, and leaves the
// transaction's statement timeout as it found it.
//
// A call not begun by until (zero: no bound) is not made: it is left as it
// was, for the loop's next iteration (the loop's hook retries, in the
// transaction that holds the pool row: one org's stuck hooks, each up to
// HookTimeout, held every org's starts for up to a hundred of them). It
// returns how many calls it made.
func (m *Manager) runHooks(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying, open bool, until time.Time) (int, error) {
	if len(calls) == 0 {
		return 0, nil
	}
	if open {
		return m.runHooksBounded(ctx, tx, calls, retrying, true, until)
	}
	var before string
	if err := tx.QueryRow(ctx, sqlHookStatementTimeout, m.hookBounds()...).Scan(&before, nil, nil); err != nil {
		return 0, fmt.Errorf("hook statement timeout: %w", err)
	}
	n, err := m.runHooksBounded(ctx, tx, calls, retrying, false, until)
	if err != nil {
		return 0, err
	}
	return n, restoreStatementTimeout(ctx, tx, before)
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
func (m *Manager) runHooksBounded(ctx context.Context, tx pgx.Tx, calls []hookCall, retrying, open bool, until time.Time) (int, error) {
	r := &hookRun{failed: map[uuid.UUID]error{}, notCalled: map[uuid.UUID]bool{}, until: until}
	if err := m.hookBatch(ctx, tx, calls, r, open); err != nil {
		return 0, err
	}
	var okIDs, badIDs []uuid.UUID
	var nextAts []time.Time
	var msgs []string
	now := m.now()
	counts := make(map[[2]string]int)
	retried := make(map[string]int) // by pool: calls made again after a failure
	// (a completion whose commit fails is recorded again, and its hooks
	// called again)
	defer db.CountAfterCommit(ctx, func() {
		for k, n := range counts {
			m.metrics.hookCalls.WithLabelValues(k[0], k[1]).Add(float64(n))
		}
		for pool, n := range retried {
			m.metrics.hookRetries.WithLabelValues(pool).Add(float64(n))
		}
	})
	called := 0
	for _, c := range calls {
		if r.notCalled[c.c.WorkID] {
			continue
		}
		called++
		if retrying && c.attempts > 0 {
			retried[c.c.Pool]++
		}
		herr, bad := r.failed[c.c.WorkID]
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
			return 0, fmt.Errorf("scheduling hook retries: %w", err)
		}
	}
	if retrying && len(okIDs) > 0 {
		if _, err := tx.Exec(ctx, sqlHookDone, pgUUIDs(okIDs)); err != nil {
			return 0, fmt.Errorf("recording hook calls: %w", err)
		}
	}
	if !retrying && len(r.notCalled) > 0 {
		// First calls not made: due now, in the retry queue, without an
		// attempt counted (a retry left out stays due as it was).
		ids := make([]uuid.UUID, 0, len(r.notCalled))
		for id := range r.notCalled {
			ids = append(ids, id)
		}
		if _, err := tx.Exec(ctx, sqlHookDeferred, pgUUIDs(ids), now); err != nil {
			return 0, fmt.Errorf("deferring hook calls: %w", err)
		}
	}
	return called, nil
}

// hookRun is what a batch of hook calls came to: the calls that failed,
// with their errors, and those not made, their time (until) up.
type hookRun struct {
	failed    map[uuid.UUID]error
	notCalled map[uuid.UUID]bool
	until     time.Time
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
func (m *Manager) hookBatch(ctx context.Context, tx pgx.Tx, calls []hookCall, r *hookRun, open bool) error {
	if len(calls) == 0 {
		return nil
	}
	if !open {
		if _, err := tx.Exec(ctx, sqlSavepoint); err != nil {
			return fmt.Errorf("hook savepoint: %w", err)
		}
	}
	htx := hookTx{hookStatements{Tx: tx, parent: ctx}}
	// What the hooks register to run after the commit is kept only if this
	// savepoint is.
	hctx, actions := db.WithAfterCommit(ctx)
	bad, herr := -1, error(nil)
	lastStatement := time.Now()
	for i, c := range calls {
		if !r.until.IsZero() && !time.Now().Before(r.until) {
			for _, left := range calls[i:] {
				r.notCalled[left.c.WorkID] = true
			}
			break
		}
		if herr = m.callHook(hctx, htx, c); herr != nil {
			bad = i
			break
		}
		if time.Since(lastStatement) > time.Second {
			// (a statement between calls once a second has passed since
			// the last one sent here: the server counts a transaction's
			// idle time from its last statement, and calls that each wait
			// in Go within the hook timeout added up past the loop's idle
			// limit — calls under a second each too)
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return fmt.Errorf("after a hook call: %w", err)
			}
			lastStatement = time.Now()
		}
	}
	if bad < 0 {
		actions.KeepIn(ctx)
		return nil
	}
	if _, err := tx.Exec(ctx, sqlRollbackSavepoint); err != nil {
		return fmt.Errorf("hook savepoint rollback: %w", err)
	}
	if err := m.hookBatch(ctx, tx, calls[:bad], r, true); err != nil {
		return err
	}
	// The failing call is called again alone only when it may have failed
	// for the calls before it: first in the batch it failed alone already,
	// and a timeout is not theirs (called again at once, a stuck hook held
	// the batch — other orgs' completions too — for twice the timeout).
	if bad == 0 || errors.Is(herr, errHookTimeout) {
		r.failed[calls[bad].c.WorkID] = herr
	} else if err := m.hookBatch(ctx, tx, calls[bad:bad+1], r, false); err != nil {
		return err
	}
	return m.hookBatch(ctx, tx, calls[bad+1:], r, false)
}

// hookTx is the transaction a hook sees: everything but ending it. Its
// statements are not cut off when the call's own time runs out: one begun
// in time runs to its end, bounded by the statement timeout on the server.
// A context that ended mid-statement closed the connection, and lost the
// completing transaction with it (a hook slow over several statements,
// each within the bound) — then the completer recorded the same batch
// again, and called the hook again, for good, every later completion of
// the replica waiting behind it. Once the call's context has ended, a
// statement is not sent. What cancels the caller (a stop, a lost
// leadership) still cuts a statement off. A transaction a hook begins in
// it (pgx.BeginFunc) is held to the same; statements through tx.Conn() are
// not.
type hookTx struct{ hookStatements }

var errHookEndsTx = errors.New("an onComplete hook must not commit or roll back the completing transaction; return an error instead")

func (hookTx) Commit(context.Context) error   { return errHookEndsTx }
func (hookTx) Rollback(context.Context) error { return errHookEndsTx }

// hookStatements runs a hook's statements on Tx: while the hook's
// context lasts, under the caller's context (parent), which the call's
// deadline does not end, with the hook context's values.
type hookStatements struct {
	pgx.Tx
	parent context.Context
}

// statementContext is the context of a hook's statement sent with ctx:
// ctx itself once it has ended (pgx then sends nothing and answers ctx's
// error), else one that ends with the caller's and carries ctx's values.
func (t hookStatements) statementContext(ctx context.Context) context.Context {
	if ctx.Err() != nil {
		return ctx
	}
	return valuesOf{Context: t.parent, values: ctx}
}

// valuesOf is Context with the values of values.
type valuesOf struct {
	context.Context
	values context.Context
}

func (c valuesOf) Value(key any) any { return c.values.Value(key) }

func (t hookStatements) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(t.statementContext(ctx), sql, args...)
}

func (t hookStatements) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(t.statementContext(ctx), sql, args...)
}

func (t hookStatements) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(t.statementContext(ctx), sql, args...)
}

func (t hookStatements) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.Tx.SendBatch(t.statementContext(ctx), b)
}

func (t hookStatements) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.Tx.CopyFrom(t.statementContext(ctx), table, columns, src)
}

func (t hookStatements) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.Tx.Prepare(t.statementContext(ctx), name, sql)
}

// Begin begins a transaction nested in the hook's (a savepoint), held to
// the same rules; the hook may commit or roll it back.
func (t hookStatements) Begin(ctx context.Context) (pgx.Tx, error) {
	nested, err := t.Tx.Begin(t.statementContext(ctx))
	if err != nil {
		return nil, err
	}
	return hookStatements{Tx: nested, parent: t.parent}, nil
}

func (t hookStatements) Commit(ctx context.Context) error {
	return t.Tx.Commit(t.statementContext(ctx))
}

// Rollback is sent even once the call's time ran out: giving up what the
// nested transaction did is what a hook past its time must do.
func (t hookStatements) Rollback(ctx context.Context) error {
	return t.Tx.Rollback(valuesOf{Context: t.parent, values: ctx})
}

// errHookTimeout marks a hook call that failed for the hook timeout: past
// HookTimeout (+ slack) in all, or a statement past the statement timeout.
var errHookTimeout = errors.New("hook timeout")

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
	err = h(hctx, tx, c.c)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(hctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		// (past its time it fails, whatever it returned: what it did goes
		// with the savepoint, and the call is retried with the backoff)
		return fmt.Errorf("hook %q did not return within the hook timeout (%s): %w", c.hook, m.cfg.HookTimeout, errors.Join(errHookTimeout, err))
	case errors.As(err, &pgErr) && pgErr.Code == "57014": // query_canceled: the statement timeout
		return fmt.Errorf("hook %q: a statement past the hook timeout (%s): %w", c.hook, m.cfg.HookTimeout, errors.Join(errHookTimeout, err))
	case err != nil:
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

// roundTripBound bounds each round trip of a transaction that runs hooks
// (a record with hooks, a loop's iteration) that cannot wait on another
// transaction's row locks: its hooks' statements — the server ends them,
// lock waits included, at HookTimeout, the statement timeout set before
// the hooks — and its reads that skip locked rows. Past it the answer is
// not coming (a connection gone silent). The statements that may wait on
// a lock (recording results, marking work canceled) are not bounded: a
// record with hooks holds its rows for as long as its hook calls take,
// and a bound cut their legitimate waits, the same on every try.
func (m *Manager) roundTripBound() time.Duration {
	return m.cfg.StatementTimeout + m.cfg.HookTimeout
}

// idleLimitWithHooks is how long a transaction that calls hooks — the
// loop's, and a record's — may sit idle on the server before the server
// ends it (a leader or a replica lost, or frozen, in its middle): 30 s, or
// longer than a hook call, which may wait in Go for up to HookTimeout (the
// loop makes them for canceled pending work, and retries them) — past the
// limit, the server ended the iteration, and every next one, with the
// cancelation it was finishing; or the record, and its every retry.
func (m *Manager) idleLimitWithHooks() time.Duration {
	return max(30*time.Second, m.cfg.HookTimeout+hookTimeoutSlack+10*time.Second)
}
