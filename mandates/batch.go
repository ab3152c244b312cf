package mandates

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/inflight"
)

// spendBatcher is group commit for Spend. Concurrent Spend calls are sent
// together as one pipeline in one implicit transaction: one round trip and
// one WAL flush serve them all, where a durable commit per spend would make
// the commit rate the ceiling. Each caller still returns only after its own
// decision has committed, and each decision is its own conditional
// statement, so a batch decides exactly what the same spends would decide
// one after another. Nothing waits to fill a batch: a batch is whatever
// queued while the previous ones ran, so a lone spend goes at once.
//
// Up to maxRunning batches run at once, but never two with the same
// mandate: they would only queue on its row lock. Spends for a mandate that
// is in flight wait and go together in the next batch, so a hot mandate
// gets big batches instead of a queue of small ones.
type spendBatcher struct {
	s          *Service
	maxBatch   int
	maxRunning int

	mu       sync.Mutex
	pending  []*spendRequest
	running  int
	inFlight map[mandateKey]bool
	drains   inflight.Set // for Stop to wait for
}

type mandateKey struct{ org, agent, scope string }

func keyOf(p SpendParams) mandateKey { return mandateKey{p.OrgID, p.AgentID, p.Scope} }

type spendRequest struct {
	p     SpendParams
	ctx   context.Context // the caller's: one that ended before a batch took it is not decided
	reply chan spendReply // buffered: the batch never waits for its caller
}

type spendReply struct {
	res     SpendResult
	decided bool
	err     error
	// alone: the batch failed before anything of it committed (it
	// panicked); the caller decides its spend on its own, in its own
	// goroutine.
	alone bool
}

// batchTimeout bounds one batch; it serves several callers, so no single
// caller's context governs it.
const batchTimeout = 30 * time.Second

func newSpendBatcher(s *Service, maxBatch, maxRunning int) *spendBatcher {
	return &spendBatcher{s: s, maxBatch: maxBatch, maxRunning: maxRunning, inFlight: map[mandateKey]bool{}}
}

// do queues p and waits for its answer. When the caller gives up first,
// a spend no batch has taken yet is dropped (nothing was decided); one a
// batch took may still be decided — its idempotency key makes a retry
// safe.
func (b *spendBatcher) do(ctx context.Context, p SpendParams) (SpendResult, bool, error) {
	if err := ctx.Err(); err != nil {
		return SpendResult{}, false, err
	}
	req := &spendRequest{p: p, ctx: ctx, reply: make(chan spendReply, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, req)
	if b.running < b.maxRunning {
		b.running++
		b.drains.Go(b.drain)
	}
	b.mu.Unlock()
	select {
	case r := <-req.reply:
		if r.alone {
			// (a bug it meets panics here, in its caller's goroutine, not
			// in the batcher's, which serves every org)
			res, decided, err := b.s.spendAlone(ctx, p)
			b.count(res, decided, err)
			return res, decided, err
		}
		return r.res, r.decided, r.err
	case <-ctx.Done():
		return SpendResult{}, false, ctx.Err()
	}
}

// drain runs batches until nothing it may take is pending, then ends. What
// it leaves (mandates in another batch) the other batch's drainer takes
// when it finishes. Its batches go under ctx, which Stop cancels
// when its own context ends first.
func (b *spendBatcher) drain(ctx context.Context) {
	var held []mandateKey
	for {
		b.mu.Lock()
		for _, k := range held {
			delete(b.inFlight, k)
		}
		batch, keys := b.take()
		if len(batch) == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		held = keys
		b.mu.Unlock()
		b.run(ctx, batch)
	}
}

// take removes from pending, in arrival order, up to maxBatch requests
// whose mandates no running batch holds, and marks their mandates held.
// Called with mu held.
func (b *spendBatcher) take() ([]*spendRequest, []mandateKey) {
	var batch []*spendRequest
	var keys []mandateKey
	mine := map[mandateKey]bool{}
	rest := b.pending[:0]
	for _, r := range b.pending {
		if r.ctx.Err() != nil {
			continue // its caller left, answered with its context's error
		}
		k := keyOf(r.p)
		if len(batch) < b.maxBatch && (mine[k] || !b.inFlight[k]) {
			if !mine[k] {
				mine[k] = true
				keys = append(keys, k)
			}
			batch = append(batch, r)
			continue
		}
		rest = append(rest, r)
	}
	clear(b.pending[len(rest):])
	b.pending = rest
	for _, k := range keys {
		b.inFlight[k] = true
	}
	return batch, keys
}

// run decides one batch. Requests are ordered by mandate, then by
// idempotency key (stably: unkeyed ones in arrival order), so that batches
// lock mandate rows and key rows in one order where they meet (batches of
// other replicas). If a statement fails,
// the batch's transaction is rolled back whole and every request in it is
// decided again on its own.
func (b *spendBatcher) run(ctx context.Context, batch []*spendRequest) {
	slices.SortStableFunc(batch, func(x, y *spendRequest) int {
		return cmp.Or(cmp.Compare(x.p.OrgID, y.p.OrgID), cmp.Compare(x.p.AgentID, y.p.AgentID),
			cmp.Compare(x.p.Scope, y.p.Scope), cmp.Compare(x.p.IdempotencyKey, y.p.IdempotencyKey))
	})
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	// A panic (a bug: in an inbox hook, say) is recovered here: in the
	// batcher's goroutine it ended the process, every org's requests with
	// it. Before anything may have committed, each request is decided on
	// its own in its caller's goroutine, so that only the one that meets
	// the bug fails; after, they fail (deciding again could spend twice).
	committing := false
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		b.s.logger.Error("spend batch panicked", "spends", len(batch), "committing", committing, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		r := spendReply{err: fmt.Errorf("spend: its batch failed: %v", p)}
		if !committing {
			r = spendReply{alone: true}
		}
		for _, req := range batch {
			select {
			case req.reply <- r:
			default: // (answered before the panic)
			}
		}
	}()
	b.s.metrics.batch.Observe(float64(len(batch)))
	if len(batch) == 1 {
		committing = true // (its statements are spendAlone's: no telling when they commit)
		res, decided, err := b.s.spendAlone(ctx, batch[0].p)
		b.count(res, decided, err)
		batch[0].reply <- spendReply{res: res, decided: decided, err: err}
		return
	}
	pb := &pgx.Batch{}
	for _, r := range batch {
		b.s.queueSpend(pb, r.p)
	}
	replies := make([]spendReply, len(batch))
	var failed error
	if b.s.cfg.Inbox == nil {
		committing = true // (one implicit transaction, committed as it ends)
		br := db.SendBatch(ctx, b.s.db, pb)
		defer br.Close() // (a panic while reading: its connection goes back)
		failed = readBatch(br, replies)
		if err := br.Close(); failed == nil && err != nil {
			failed = err
		}
	} else {
		// The refusals' inbox events commit with their requests.
		failed = decideInTx(ctx, b.s.db, pb, func(br pgx.BatchResults) error { return readBatch(br, replies) },
			func(q db.Batcher) error {
				var refusals []refusal
				for i, r := range batch {
					if replies[i].decided && !replies[i].res.OK {
						refusals = append(refusals, refusal{r.p.OrgID, replies[i].res.ApprovalID})
					}
				}
				err := b.s.appendRequestedAll(ctx, q, refusals)
				committing = true // (its COMMIT comes next: a panic from here on may follow it)
				return err
			})
		// (a panic before that rolled the batch back)
		committing = true
	}
	if failed != nil {
		b.retryAlone(ctx, batch, failed)
		return
	}
	for i := range batch {
		b.count(replies[i].res, replies[i].decided, nil)
	}
	for i, r := range batch {
		if !replies[i].decided {
			// The key was used before (or earlier in this batch): its first
			// answer is committed now.
			res, err := b.s.answer(ctx, b.s.db, r.p)
			replies[i] = spendReply{res: res, err: err}
			if errors.Is(err, errKeyPurged) {
				// (past its window, purged since the decision: decide afresh)
				res, decided, err := b.s.spendAlone(ctx, r.p)
				b.count(res, decided, err)
				replies[i] = spendReply{res: res, decided: decided, err: err}
			}
		}
		r.reply <- replies[i]
	}
}

// readBatch reads the decisions of a batch in order.
func readBatch(br pgx.BatchResults, replies []spendReply) error {
	for i := range replies {
		res, decided, err := readSpend(br)
		if err != nil {
			return err
		}
		replies[i] = spendReply{res: res, decided: decided}
	}
	return nil
}

// retryAlone decides each request of a failed batch on its own. Only an
// error the server reported (it then rolled the transaction back) is safe
// to retry; after any other failure the commit's outcome is unknown and the
// error goes to every caller, as it would without batching.
func (b *spendBatcher) retryAlone(ctx context.Context, batch []*spendRequest, failed error) {
	var pgErr *pgconn.PgError
	if !errors.As(failed, &pgErr) {
		for _, r := range batch {
			r.reply <- spendReply{err: failed}
		}
		return
	}
	b.s.logger.Debug("spend batch failed; deciding its spends one by one", "spends", len(batch), "error", failed.Error())
	for i, r := range batch {
		if !b.decideAlone(ctx, r) {
			// (it panicked, and failed alone: the spends after it were
			// not tried, and go alone in their callers' goroutines)
			for _, rest := range batch[i+1:] {
				rest.reply <- spendReply{alone: true}
			}
			return
		}
	}
}

// decideAlone decides r on its own and answers it; false when that
// panicked (a bug), which answers r with an error.
func (b *spendBatcher) decideAlone(ctx context.Context, r *spendRequest) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			b.s.logger.Error("spend panicked", "org_id", r.p.OrgID, "agent_id", r.p.AgentID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			select {
			case r.reply <- spendReply{err: fmt.Errorf("spend: it failed: %v", p)}:
			default: // (answered before the panic)
			}
			ok = false
		}
	}()
	res, decided, err := b.s.spendAlone(ctx, r.p)
	b.count(res, decided, err)
	r.reply <- spendReply{res: res, decided: decided, err: err}
	return true
}

// count counts a decision the batcher committed in
// reveille_mandates_spends_total, once, whether or not its caller still
// waits for it.
func (b *spendBatcher) count(res SpendResult, decided bool, err error) {
	if err == nil && decided {
		b.s.metrics.spend(res.OK)
	}
}
