package workpool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reveille/reveille/internal/db"
)

// completer records the results of the attempts this replica ran — River's
// jobcompleter is the model. It is the one owner of the step that ends an
// attempt: one statement (sqlComplete) records the result, frees the slot
// and decides the next state, and the onComplete hooks of the work that
// finished run in the same transaction; after the commit it runs what the
// hooks handed over (AfterCommit) and wakes the pools' loops to fill the
// freed slots. The executor reaches it only through add; the loop never
// does (it records the attempts it recovers with completeTx, the same
// statement, in its own transaction).
//
// Results are batched with one transaction in flight: results that arrive
// meanwhile form the next, larger batch, and a lone result goes at once —
// so a wake-up costs one commit, not an iteration of the loop. (Two in flight
// measured slower, 18.9k vs 21.3k jobs/s at parallelism 100: smaller
// batches, more WAL flushes; docs/benchmarks.md § pool.) The loops' kick
// for the slots a batch freed waits for the next batch when one is already
// queued behind it (see drain).
type completer struct {
	m        *Manager
	recorded func([]attemptResult) // the executor forgets these attempts
	crashed  func() bool           // tests: behave like a killed process
	// kickLoops wakes the loops of the pools whose slots were freed
	// (Manager.wakeLoops; tests: a recorder)
	kickLoops func(ctx context.Context, pools map[string]bool)

	mu       sync.Mutex
	pending  []attemptResult
	wake     chan struct{}
	closing  chan struct{}
	closed   chan struct{}
	flushCtx context.Context
	closeErr error
	ctx      context.Context // canceled after close, or by a simulated crash
	cancel   context.CancelFunc
	started  bool
	// flushed: the last flush at Stop is over, so a result added later
	// (work a loop slow to stop handed the executor after its drain) is
	// recorded by add itself.
	flushed bool
}

func newCompleter(m *Manager, recorded func([]attemptResult), crashed func() bool) *completer {
	c := &completer{m: m, recorded: recorded, crashed: crashed, kickLoops: m.wakeLoops, wake: make(chan struct{}, 1),
		closing: make(chan struct{}), closed: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Start runs the completer until Stop.
func (c *completer) Start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return
	}
	c.started = true
	go c.run()
}

// Stop records what is left (bounded by ctx) and stops; it returns an error
// if results could not be recorded (they are then recovered by the pools'
// loops after the heartbeat timeout).
func (c *completer) Stop(ctx context.Context) error {
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	c.flushCtx = ctx
	close(c.closing)
	select {
	case <-c.closed:
		c.cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closeErr
	case <-ctx.Done():
		c.cancel()
		return fmt.Errorf("workpool completer: recording results at stop: %w", ctx.Err())
	}
}

// add queues one attempt's result to be recorded.
func (c *completer) add(r attemptResult) {
	c.mu.Lock()
	if c.flushed {
		c.mu.Unlock()
		c.recordLate(r)
		return
	}
	c.pending = append(c.pending, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *completer) take() []attemptResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.pending), reportBatch)
	batch := append([]attemptResult(nil), c.pending[:n]...)
	c.pending = c.pending[n:]
	if len(c.pending) == 0 {
		c.pending = nil
	}
	return batch
}

func (c *completer) run() {
	defer close(c.closed)
	for {
		select {
		case <-c.ctx.Done(): // a simulated crash
			return
		case <-c.wake:
			if c.drain(c.ctx) != nil {
				return
			}
		case <-c.closing:
			if err := c.flushLast(); err != nil && !errors.Is(err, errCrashed) {
				c.mu.Lock()
				c.closeErr = err
				c.mu.Unlock()
			}
			return
		}
	}
}

// drain records what is queued, batch by batch, and wakes the loops to
// fill the slots each batch freed. A batch recorded while the next one is
// already queued leaves that wake to the next batch's commit: a loop woken
// at once would start the few items whose slots this batch freed, beside
// the next batch's commit, then start again for that one's — under load,
// about half the loop's starts were of one item (a lone first result goes
// at once, the rest of its burst queues behind it). Waking once for both
// halves the loop's statements (docs/benchmarks.md § pool, session 18).
// The held wake goes out with the next batch's, or as soon as that batch
// must be retried (the database is unwell: the slots must not wait for
// it), or when the drain ends without it (a stop out of time). The
// wake-ups that hooks hand over (AfterCommit) are never held: only the
// loops' kicks.
func (c *completer) drain(ctx context.Context) error {
	var held map[string]bool // the pools of a recorded batch whose kick goes with the next
	release := func(ctx context.Context) {
		if held != nil {
			c.kickLoops(ctx, held)
			held = nil
		}
	}
	defer func() {
		if held != nil && !c.crashed() { // (a crashed process wakes nobody)
			// The next batch was not recorded: the drain's context ended.
			// The kick still goes, its NOTIFY for a loop led elsewhere
			// under a bound of its own.
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kickTimeout)
			defer cancel()
			release(kctx)
		}
	}()
	for batch := c.take(); len(batch) > 0; batch = c.take() {
		if err := c.record(ctx, batch, func() { release(ctx) }); err != nil {
			return err
		}
		pools := poolsOf(batch)
		if held == nil && c.queued() {
			held = pools
			continue
		}
		maps.Copy(pools, held)
		held = nil
		c.kickLoops(ctx, pools)
	}
	return nil
}

// queued reports whether results wait to be recorded.
func (c *completer) queued() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) > 0
}

// flushLast is Stop's flush: it records what is queued and marks the
// completer flushed under the lock that finds the queue empty, so that no
// result can land in a queue nobody reads any more.
func (c *completer) flushLast() error {
	for {
		if err := c.drain(c.flushCtx); err != nil {
			return err
		}
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.flushed = true
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
	}
}

// recordLate records one result that arrived after the last flush, at
// once and within the bound of a stop's recording: left unrecorded, its
// work would stay running until the heartbeat timeout counted an attempt.
func (c *completer) recordLate(r attemptResult) {
	ctx, cancel := context.WithTimeout(context.Background(), recordAtStop)
	defer cancel()
	if err := c.record(ctx, []attemptResult{r}, nil); err != nil {
		c.m.logger.Warn("recording an attempt's result after the stop failed; the heartbeat timeout will recover its work",
			"work_id", r.id.String(), "error", err.Error())
		c.m.metrics.failedAt(stageRecord)
		return
	}
	c.kickLoops(ctx, poolsOf([]attemptResult{r}))
}

// record commits one batch, retrying until it succeeds: every statement
// ignores what is already recorded, so a retry after an unknown outcome is
// safe. Waking the loops is the caller's; retrying (if not nil) is called
// once, before the first retry.
func (c *completer) record(ctx context.Context, batch []attemptResult, retrying func()) error {
	m := c.m
	t0 := time.Now()
	backoff := newBackoff(50*time.Millisecond, 5*time.Second)
	var rows []finishedRow
	for {
		if c.crashed() {
			return errCrashed
		}
		var err error
		if rows, err = m.recordResults(ctx, batch); err == nil {
			break
		}
		if ctx.Err() != nil {
			return err
		}
		m.logger.Warn("recording attempt results failed; retrying", "count", len(batch), "error", err.Error())
		m.metrics.failedAt(stageRecord)
		if retrying != nil {
			retrying()
			retrying = nil
		}
		if !sleepCtx(ctx, backoff.next()) {
			return ctx.Err()
		}
	}
	m.metrics.reportSeconds.Observe(time.Since(t0).Seconds())
	m.metrics.reportBatch.Observe(float64(len(batch)))
	m.countRecorded(rows)
	m.noteCompleted(rows)
	c.recorded(batch)
	return nil
}

var errCrashed = errors.New("executor crashed (test)")

func poolsOf(batch []attemptResult) map[string]bool {
	pools := map[string]bool{}
	for _, res := range batch {
		pools[res.pool] = true
	}
	return pools
}

// recordResults records a batch in its own transaction: with a hook to
// run, a transaction whose BEGIN travels with the statement (recordWithHooks);
// without, one implicit transaction — one round trip.
func (m *Manager) recordResults(ctx context.Context, results []attemptResult) ([]finishedRow, error) {
	for _, r := range results {
		if r.hook {
			return m.recordWithHooks(ctx, results)
		}
	}
	// One statement, not bounded: it may wait on rows a record with hooks
	// or an iteration holds through its hook calls (a retry's org queue,
	// the work's row), and a bound cut that legitimate wait on every try,
	// every later result of the replica behind it. A connection the
	// network dropped is ended by the dialer's TCP bounds (db.Dial).
	rows, err := m.db.Query(ctx, sqlComplete, m.completeArgs(results)...)
	var done []finishedRow
	if err == nil {
		done, err = scanFinished(rows)
	}
	if isItemDataError(err) {
		// One item's result is refused: find it in a transaction.
		return m.recordWithHooks(ctx, results)
	}
	if err != nil {
		return nil, fmt.Errorf("completing %d attempts: %w", len(results), err)
	}
	if calls := hookCalls(done); len(calls) > 0 {
		// Cannot happen: a hook is set at enqueue and reported at claim.
		m.logger.Error("completed work with a hook outside a hook transaction", "work_id", calls[0].c.WorkID.String())
	}
	return done, nil
}

// completeTx records a batch of attempt results in tx and runs the hooks
// of the work that finished. A duplicate or stale result changes nothing
// and runs no hook. An item whose result Postgres refuses (a value out of
// range) is finished as failed with that error, alone: it never holds up
// the rest of the batch. Waking the loops is the caller's job, after
// commit (see wakeLoops).
func (m *Manager) completeTx(ctx context.Context, tx pgx.Tx, results []attemptResult) ([]finishedRow, error) {
	return m.completeIn(ctx, tx, results, false, time.Time{})
}

// completeTxCallingHooksUntil is completeTx whose hook calls begin before
// until; the calls it does not make wait in the hook retry queue, due at
// once (runHooks).
func (m *Manager) completeTxCallingHooksUntil(ctx context.Context, tx pgx.Tx, results []attemptResult, until time.Time) ([]finishedRow, error) {
	return m.completeIn(ctx, tx, results, false, until)
}

const (
	sqlCompleteSavepoint         = "SAVEPOINT workpool_complete"
	sqlRollbackCompleteSavepoint = "ROLLBACK TO SAVEPOINT workpool_complete"
)

// completeIn is completeTx; with begin, the batch opens tx's transaction
// itself (a connTx not yet begun), which saves a round trip.
func (m *Manager) completeIn(ctx context.Context, tx pgx.Tx, results []attemptResult, begin bool, hooksUntil time.Time) ([]finishedRow, error) {
	if len(results) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	if begin {
		b.Queue("BEGIN")
	}
	b.Queue(sqlCompleteSavepoint)
	b.Queue(sqlComplete, m.completeArgs(results)...)
	// The hooks' bound comes after the recording (which may wait on a row
	// lock, a loop's iteration holding the row: bound by HookTimeout, it
	// failed the whole batch, every org's results in it) and before the
	// hooks' savepoint (rolling back to it keeps the bound).
	b.Queue(sqlHookStatementTimeout, m.hookBounds()...)
	b.Queue(sqlSavepoint) // cheap, and saves a round trip before the hooks
	br := tx.SendBatch(ctx, b)
	var err error
	if begin {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	var done []finishedRow
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			done, err = scanFinished(rows)
		}
	}
	var before string
	if err == nil {
		err = br.QueryRow().Scan(&before, nil, nil)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if isItemDataError(err) {
		// (rolled back to the recording's savepoint: the bound goes too)
		done, err = m.completeApart(ctx, tx, results, err)
		if err == nil {
			err = tx.QueryRow(ctx, sqlHookStatementTimeout, m.hookBounds()...).Scan(&before, nil, nil)
		}
		if err == nil {
			_, err = tx.Exec(ctx, sqlSavepoint)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("completing %d attempts: %w", len(results), err)
	}
	// The hooks' round trips are bounded (roundTripBound); the recording's
	// above are not: they may wait on rows another record holds through its
	// hook calls.
	hooksTx := db.BoundRoundTrips(tx, m.roundTripBound())
	if _, err := m.runHooks(ctx, hooksTx, hookCalls(done), false, true, hooksUntil); err != nil {
		return nil, err
	}
	if !begin {
		// The caller's transaction goes on (the loop's: starts follow).
		if err := restoreStatementTimeout(ctx, hooksTx, before); err != nil {
			return nil, err
		}
	}
	return done, nil
}

// completeApart records results whose batch statement failed on one item's
// data (cause): it rolls back to the savepoint set before it, then records
// each half under a savepoint of its own, down to the items that fail alone,
// which finish as failed with the error.
func (m *Manager) completeApart(ctx context.Context, tx pgx.Tx, results []attemptResult, cause error) ([]finishedRow, error) {
	if _, err := tx.Exec(ctx, sqlRollbackCompleteSavepoint); err != nil {
		return nil, err
	}
	if len(results) == 1 {
		r := results[0]
		msg := "the attempt's result could not be recorded: " + cause.Error()
		m.logger.Warn("an attempt's result was refused; finishing the work as failed", "work_id", r.id.String(),
			"pool", r.pool, "error", cause.Error())
		rows, err := tx.Query(ctx, sqlCompleteUnstorable, pgUUIDs([]uuid.UUID{r.id}), []int32{int32(r.attempt)},
			errorText(errors.New(msg)), m.now())
		if err != nil {
			return nil, err
		}
		return scanFinished(rows)
	}
	var all []finishedRow
	for _, half := range [][]attemptResult{results[:len(results)/2], results[len(results)/2:]} {
		if _, err := tx.Exec(ctx, sqlCompleteSavepoint); err != nil {
			return nil, err
		}
		rows, err := tx.Query(ctx, sqlComplete, m.completeArgs(half)...)
		var done []finishedRow
		if err == nil {
			done, err = scanFinished(rows)
		}
		if isItemDataError(err) {
			done, err = m.completeApart(ctx, tx, half, err)
		}
		if err != nil {
			return nil, err
		}
		all = append(all, done...)
	}
	return all, nil
}

// isItemDataError says whether err is Postgres refusing a value (data
// exception, integrity violation, program limit): the fault of one item's
// data, which a retry of the same batch would meet again.
func isItemDataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// completeArgs are sqlComplete's arrays for results.
func (m *Manager) completeArgs(results []attemptResult) []any {
	results = byID(results)
	n := len(results)
	ids, attempts := make([]uuid.UUID, n), make([]int32, n)
	kinds, res, errs, retryable := make([]string, n), make([]*string, n), make([]string, n), make([]bool, n)
	for i, r := range results {
		ids[i], attempts[i], errs[i], retryable[i], kinds[i] = r.id, int32(r.attempt), r.err, r.retryable, r.kind
		if r.kind == kindSucceeded {
			s := "null"
			if len(r.result) > 0 {
				s = string(r.result)
			}
			res[i] = &s
		}
	}
	return []any{pgUUIDs(ids), attempts, kinds, res, errs, retryable, m.now(), [16]byte(m.exec.id)}
}

// countRecorded counts what a recording did, per pool.
func (m *Manager) countRecorded(rows []finishedRow) {
	handedBack, ids := 0, []string(nil)
	for _, r := range rows {
		if r.kind == kindHandBack {
			if handedBack++; len(ids) < 20 {
				ids = append(ids, r.id.String())
			}
		}
		rep := m.report(r.pool)
		switch {
		case r.state == "finished" && r.outcome != nil:
			rep.finished(Outcome(*r.outcome))
			if Outcome(*r.outcome) == OutcomeFailed {
				// (the one line an operator finds a failure by: retries
				// are in the metrics, a final failure is here too)
				m.logger.Info("work failed for good", "work_id", r.id, "org_id", r.orgID, "pool", r.pool,
					"handler", r.handler, "attempts", r.attempts, "error", textOf(r.errText))
			}
		case r.kind == kindFailed:
			rep.retried(1)
		}
	}
	if handedBack > 0 {
		m.logger.Info("handed work back at stop: it is pending again at once, its attempt not counted, for another replica to run",
			"count", handedBack, "work_ids", ids)
	}
}

// wakeLoops tells the loops of pools that slots were freed: directly when
// this replica leads the pool, else by a NOTIFY in its own (write-free, so
// flush-free) transaction.
func (m *Manager) wakeLoops(ctx context.Context, pools map[string]bool) {
	var remote []string
	for p := range pools {
		if l := m.loopFor(p); l != nil && l.leading.Load() {
			l.kick(kickWork)
			continue
		}
		remote = append(remote, "k:"+p+"@"+m.origin)
	}
	if len(remote) == 0 {
		return
	}
	if _, err := m.db.Exec(ctx, sqlNotifyEach, remote); err != nil && ctx.Err() == nil {
		// The loop still fills the slots at its next wake-up (its recovery
		// timer runs while slots are in use).
		m.logger.Warn("waking pool loops failed", "error", err.Error())
	}
}

// textOf is *s, "" for nil.
func textOf(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
