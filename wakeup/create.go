package wakeup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/inflight"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// createBatcher is group commit for Create. Concurrent requests go through
// the protocol together, on one connection: their gate is one transaction
// (one commit for all their spends and intents) and their enqueue another
// (one commit and one NOTIFY). A NOTIFY serialises the commits of the
// transactions that send one, so a commit per request would make that
// commit rate the ceiling. Each request's decisions are still its own
// statements, so a group decides what the same requests would decide one
// after another. Nothing waits to fill a group: a group is whatever queued
// while the previous ones ran, so a lone request goes at once.
//
// A group is four round trips (createGroup): its BEGIN travels with the
// intents' inserts and the pending-cap reads; then the spends; then their
// commit, the second transaction's BEGIN and its row locks; the enqueue
// travels with the intents' marks and the commit. The spends' commit waits
// one round trip for the approvals inbox's events of the refusals, which
// are written once the decisions are known (in the same transaction, so a
// request never commits without its event): a group's mandates stay locked
// across that round trip. No other lock another group waits for — an org's
// pending count in a pool — is held across a round trip.
type createBatcher struct {
	s          *Service
	maxBatch   int
	maxRunning int

	mu      sync.Mutex
	pending []*createRequest
	running int
	drains  inflight.Set // for Stop to wait for
}

// createBatchers is how many groups may run at once: two, so that one
// group's round trips overlap the other's while each carries what arrived
// meanwhile. More split the same requests into smaller groups that queue
// on the same rows — a hot mandate, an org's pending count in a pool — and
// on the commits a NOTIFY serialises (docs/benchmarks.md § rest: at 32
// clients, 8 groups carried 3 requests each and served ~2,500/s, 2
// carried 9 and served ~3,500/s). Groups take the rows they share in one
// order.
const createBatchers = 2

// groupTimeout bounds one group; it serves several callers, so no single
// caller's context governs it.
const groupTimeout = 30 * time.Second

type createRequest struct {
	p     CreateParams
	ctx   context.Context  // the caller's: one that ended before a group took it is not run
	reply chan createReply // buffered: the group never waits for its caller
}

// createReply is a group's answer to one request: w and err as Create
// returns them, or one of the two ways the group hands the request back.
type createReply struct {
	w   Wakeup
	err error
	// replay: the request's idempotency key names a committed wake-up.
	replay bool
	// alone: the group failed before it committed anything; the request
	// goes through the protocol on its own.
	alone bool
}

func newCreateBatcher(s *Service, maxBatch int) *createBatcher {
	return &createBatcher{s: s, maxBatch: maxBatch, maxRunning: createBatchers}
}

// do queues p and waits for its answer. When the caller gives up first,
// a request no group has taken yet is dropped (nothing was done for it);
// one a group took may still be created — its idempotency key makes a
// retry safe.
func (b *createBatcher) do(ctx context.Context, p CreateParams) createReply {
	if err := ctx.Err(); err != nil {
		return createReply{err: err}
	}
	req := &createRequest{p: p, ctx: ctx, reply: make(chan createReply, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, req)
	if b.running < b.maxRunning {
		b.running++
		b.drains.Go(b.drain)
	}
	b.mu.Unlock()
	select {
	case r := <-req.reply:
		return r
	case <-ctx.Done():
		return createReply{err: ctx.Err()}
	}
}

// drain runs groups until nothing is pending, then ends.
func (b *createBatcher) drain(ctx context.Context) {
	for {
		b.mu.Lock()
		n := min(len(b.pending), b.maxBatch)
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		group := slices.Clone(b.pending[:n])
		clear(b.pending[:n])
		b.pending = b.pending[n:]
		b.mu.Unlock()
		// (a caller that left while its request waited was answered with
		// its context's error: nothing is done for it)
		group = slices.DeleteFunc(group, func(r *createRequest) bool { return r.ctx.Err() != nil })
		if len(group) == 0 {
			continue
		}

		gctx, cancel := context.WithTimeout(ctx, groupTimeout)
		b.s.metrics.createBatch.Observe(float64(len(group)))
		b.s.createGroup(gctx, group)
		cancel()
	}
}

// member is one request in its group.
type member struct {
	req      *createRequest
	id       uuid.UUID
	answered bool

	createdAt time.Time
	inserted  bool // false: its idempotency key names an earlier wake-up
	pair      pendingPair
	dropped   error // refused before the spend: its intent is deleted
	spend     *mandates.QueuedSpend
	res       mandates.SpendResult
	funded    bool // locked as funded in the second transaction
	workID    uuid.UUID
	updatedAt time.Time
}

type pendingPair struct{ org, pool string }

func (m *member) answer(r createReply) {
	if !m.answered {
		m.answered = true
		m.req.reply <- r
	}
}

// wakeup is the member's wake-up as Create returns it, from what the group
// wrote (no read after the writes).
func (m *member) wakeup() Wakeup {
	p := m.req.p
	w := Wakeup{
		ID: m.id, OrgID: p.OrgID, AgentID: p.AgentID, WorkflowID: p.WorkflowID, RunID: p.RunID, Signal: p.Signal,
		Scope: p.Scope, Reason: p.Reason, Cost: p.Cost, Pool: p.Pool, Work: p.Work,
		Status: StatusPending, Delivery: Delivery{State: DeliveryWaiting}, CreatedAt: m.createdAt, UpdatedAt: m.createdAt,
	}
	if m.spend != nil && !m.res.OK {
		w.Approval = &Approval{ID: m.res.ApprovalID, State: mandates.StatePending}
	}
	if m.workID != uuid.Nil {
		id := m.workID
		w.WorkID, w.UpdatedAt = &id, m.updatedAt
	}
	return w
}

// The group's own statements, one per intent: each finds its row by
// primary key with scalar parameters. (With arrays, joined to unnest(),
// the plan cached on a connection kept walking the whole table for as long
// as the table's statistics said it was empty: in a new database, minutes.)
const (
	// qInsertIntent inserts an intent as funded; a concurrent duplicate of
	// its key waits for the first to commit, then inserts nothing.
	qInsertIntent = `
INSERT INTO wakeups (id, org_id, agent_id, workflow_id, run_id, signal, scope, reason, cost, pool, work, state, idempotency_key, created_by)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11, 'funded', $12, $13)
ON CONFLICT (org_id, agent_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING created_at`

	// qDropIntent deletes, before the commit, an intent refused before its
	// spend. $1 org, $2 id.
	qDropIntent = `DELETE FROM wakeups WHERE org_id = $1 AND id = $2`

	// qAwaitApproval marks an intent whose spend was refused: one whose
	// approval request (its id $3 fixed before the spend) exists. $1 org,
	// $2 id.
	qAwaitApproval = `
UPDATE wakeups SET state = 'awaiting_approval', approval_id = $3
 WHERE org_id = $1 AND id = $2 AND EXISTS (SELECT 1 FROM mandate_approvals WHERE org_id = $1 AND id = $3)`

	// qLockFunded locks, in the second transaction, an intent still funded
	// (a cancel or the reconciler may have settled it meanwhile). $1 org,
	// $2 id.
	qLockFunded = `SELECT true FROM wakeups WHERE org_id = $1 AND id = $2 AND state = 'funded' FOR UPDATE`

	// qMarkEnqueued records an intent's enqueued work $3, in the enqueue's
	// round trip: only if the work is there (an enqueue that inserted
	// nothing marks nothing). $1 org, $2 id.
	qMarkEnqueued = `
UPDATE wakeups SET state = 'enqueued', work_id = $3, updated_at = now()
 WHERE org_id = $1 AND id = $2 AND EXISTS (SELECT 1 FROM workpool_work WHERE org_id = $1 AND id = $3)
RETURNING updated_at`
)

// groupConn is the connection a group runs on, with the transaction its
// batches open and close themselves.
type groupConn struct {
	*pgx.Conn
	// committing is set once the group's first COMMIT is sent: from then
	// on what the group wrote may stand.
	committing *bool
}

// rollback ends a transaction a failed batch left open. A connection that
// cannot is closed (the pool then drops it).
func (c groupConn) rollback(ctx context.Context) { db.RollbackOpen(ctx, c.Conn) }

// createGroup runs the protocol for a group of requests and answers each.
func (s *Service) createGroup(ctx context.Context, reqs []*createRequest) {
	ms := make([]*member, len(reqs))
	for i, r := range reqs {
		ms[i] = &member{req: r, id: uuid.Must(uuid.NewV7())}
	}
	// Concurrent groups take idempotency keys in one order, so that two
	// groups waiting on each other's keys cannot deadlock.
	slices.SortStableFunc(ms, func(a, b *member) int {
		return cmp.Or(cmp.Compare(a.req.p.OrgID, b.req.p.OrgID), cmp.Compare(a.req.p.AgentID, b.req.p.AgentID),
			cmp.Compare(a.req.p.IdempotencyKey, b.req.p.IdempotencyKey))
	})
	// A panic in the group (a bug) is logged with its stack: the group's
	// goroutine serves every org, and unrecovered the panic would end the
	// process. Before the group's first COMMIT its requests go alone, in
	// their callers' goroutines (where the HTTP layer's recovery answers
	// 500 for the one that meets the bug again); after it they fail, as
	// after any failure then: what the group committed stands (the
	// reconciler enqueues a funded wake-up; a retry under its
	// Idempotency-Key replays it).
	committing := false
	defer func() {
		r := createReply{err: errors.New("wake-up request left unanswered")} // cannot happen: every path answers
		if p := recover(); p != nil {
			s.logger.Error("wake-up group panicked", "requests", len(ms), "committing", committing, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			r.err = fmt.Errorf("wake-up request: its group failed: %v", p)
			if !committing {
				// Nothing committed (the transaction rolled back as the
				// panic unwound): each request goes alone, so that only
				// the one that meets the bug fails.
				r = createReply{alone: true}
			}
		}
		for _, m := range ms {
			m.answer(r)
		}
	}()
	pc, err := s.db.Acquire(ctx)
	if err != nil {
		failAll(ms, fmt.Errorf("acquiring a connection: %w", err))
		return
	}
	defer pc.Release()
	c := groupConn{pc.Conn(), &committing}
	defer c.rollback(ctx)

	if err := s.gateGroup(ctx, c, ms); err != nil {
		// Nothing committed: a statement the server refused rolled back the
		// whole transaction, so each request goes alone (and meets its own
		// error, or none) once the transaction no longer holds its keys;
		// after any other failure the commit's outcome is unknown and the
		// error goes to every caller, as it would alone.
		c.rollback(ctx)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			s.logger.Debug("wake-up gate group failed; its requests go alone", "requests", len(ms), "error", err.Error())
			for _, m := range ms {
				m.answer(createReply{alone: true})
			}
			return
		}
		failAll(ms, err)
		return
	}
	for _, m := range ms {
		switch {
		case !m.inserted:
			m.answer(createReply{replay: true})
		case m.spend != nil && !m.res.OK:
			s.metrics.created.WithLabelValues("refused").Inc()
			s.logRefused(ctx, m.req.p.OrgID, m.id, m.res.ApprovalID, m.res.Refusal)
			w := m.wakeup()
			m.answer(createReply{w: w, err: &RefusedError{Wakeup: w, ApprovalID: m.res.ApprovalID, Refusal: m.res.Refusal}})
		case m.spend != nil:
			s.metrics.created.WithLabelValues("funded").Inc()
			s.logger.DebugContext(ctx, "wake-up created, funded", "org_id", m.req.p.OrgID, "wakeup_id", m.id, "workflow_id", m.req.p.WorkflowID)
		}
	}
	s.enqueueGroup(ctx, c, ms)
}

func failAll(ms []*member, err error) {
	for _, m := range ms {
		m.answer(createReply{err: err})
	}
}

// gateGroup is the first transaction for the whole group: every intent is
// inserted and its spend decided, and the transaction commits. The second
// transaction begins and locks the funded intents in the same round trip
// as that commit.
func (s *Service) gateGroup(ctx context.Context, c groupConn, ms []*member) error {
	checks, err := s.insertIntents(ctx, c, ms)
	if err != nil {
		return err
	}
	for pair, check := range checks {
		// (one check for all the pair's requests: each needs its own room,
		// as one after another each would find the ones before it counted)
		var pairs []*member
		for _, m := range ms {
			if m.inserted && m.pair == pair {
				pairs = append(pairs, m)
			}
		}
		room, err := check.DecideN(ctx, c, int64(len(pairs)))
		if !errors.Is(err, workpool.ErrTooManyPending) && err != nil {
			return err
		}
		for i, m := range pairs {
			if int64(i) >= room {
				m.dropped = err
			}
		}
	}
	// Spends lock their mandates in one order, whatever the group: two
	// groups waiting on each other's mandates cannot deadlock.
	byMandate := slices.Clone(ms)
	slices.SortStableFunc(byMandate, func(a, b *member) int {
		return cmp.Or(cmp.Compare(a.req.p.OrgID, b.req.p.OrgID), cmp.Compare(a.req.p.AgentID, b.req.p.AgentID),
			cmp.Compare(a.req.p.Scope, b.req.p.Scope))
	})
	b := &pgx.Batch{}
	var dropped, spenders []*member
	for _, m := range byMandate {
		if !m.inserted {
			continue
		}
		p := m.req.p
		if m.dropped == nil {
			data, _ := json.Marshal(resolveData{WakeupID: m.id})
			m.spend, m.dropped = s.mandates.QueueSpend(b, mandates.SpendParams{
				OrgID: p.OrgID, AgentID: p.AgentID, Scope: p.Scope, Cost: p.Cost, Reason: p.Reason,
				IdempotencyKey: "wakeup:" + m.id.String(), RequestedBy: p.RequestedBy,
				OnResolve: &mandates.Payload{Kind: ResolveKind, Data: data},
			})
		}
		if m.dropped != nil {
			dropped = append(dropped, m)
			m.answer(createReply{err: m.dropped})
			continue
		}
		spenders = append(spenders, m)
	}
	return s.decideGroup(ctx, c, b, spenders, dropped)
}

// insertIntents opens the group's transaction and inserts its intents,
// reading the pending counts of their (org, pool) pairs in the same round
// trip.
func (s *Service) insertIntents(ctx context.Context, c groupConn, ms []*member) (map[pendingPair]*workpool.PendingCheck, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	checks := map[pendingPair]*workpool.PendingCheck{}
	var order []pendingPair
	for _, m := range ms {
		p := m.req.p
		work, err := json.Marshal(p.Work)
		if err != nil {
			return nil, err
		}
		var key *string
		if p.IdempotencyKey != "" {
			key = &p.IdempotencyKey
		}
		b.Queue(qInsertIntent, m.id, p.OrgID, p.AgentID, p.WorkflowID, p.RunID, p.Signal, p.Scope, p.Reason, p.Cost, p.Pool, work, key, p.RequestedBy)
		m.pair = pendingPair{p.OrgID, p.Pool}
		if _, ok := checks[m.pair]; !ok {
			checks[m.pair] = nil
			order = append(order, m.pair)
		}
	}
	for _, pair := range order {
		checks[pair] = s.pool.QueuePendingCheck(b, pair.org, pair.pool)
	}
	br := db.SendBatch(ctx, c, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	for _, m := range ms {
		err := br.QueryRow().Scan(&m.createdAt)
		m.inserted = err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("insert wake-up: %w", err)
		}
	}
	for _, pair := range order {
		if err := checks[pair].Read(br); err != nil {
			return nil, err
		}
	}
	return checks, br.Close()
}

// decideGroup sends the spends queued in b with the refused intents'
// deletion before them and their marks after them (readDecisions), and
// commits; then it begins the second transaction and locks the funded
// intents (in id order) in the same round trip as the commit.
func (s *Service) decideGroup(ctx context.Context, c groupConn, b *pgx.Batch, spenders, dropped []*member) error {
	decisions := b.QueuedQueries
	b.QueuedQueries = nil
	for _, m := range dropped {
		b.Queue(qDropIntent, m.req.p.OrgID, m.id)
	}
	b.QueuedQueries = append(b.QueuedQueries, decisions...)
	for _, m := range spenders {
		b.Queue(qAwaitApproval, m.req.p.OrgID, m.id, m.spend.ApprovalID)
	}
	if err := s.readDecisions(ctx, c, b, spenders, dropped); err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue("COMMIT")
	// Only granted spends funded an intent: a group the mandates refused
	// whole opens no second transaction (it would only be rolled back).
	byID := slices.DeleteFunc(slices.Clone(spenders), func(m *member) bool { return !m.res.OK })
	slices.SortFunc(byID, func(a, b *member) int { return bytes.Compare(a.id[:], b.id[:]) })
	if len(byID) > 0 {
		b.Queue("BEGIN")
		for _, m := range byID {
			b.Queue(qLockFunded, m.req.p.OrgID, m.id)
		}
	}
	*c.committing = true
	br := db.SendBatch(ctx, c, b)
	defer br.Close()
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return fmt.Errorf("committing the wake-up gate: %w", err)
	}
	for _, m := range spenders {
		s.mandates.CountSpend(m.res) // (only now: a group that fails is sent again alone)
	}
	if len(byID) == 0 {
		return br.Close()
	}
	// Committed: from here on a failure leaves the funded intents to be
	// enqueued one by one.
	if _, err = br.Exec(); err == nil {
		err = readLocked(br, byID)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.logger.Warn("locking funded wake-ups failed; enqueueing them one by one", "error", err.Error())
		c.rollback(ctx)
		markFundedAlone(spenders)
	}
	return nil
}

// readDecisions sends the refused intents' deletion, the spends and the
// refused intents' marks, reads the decisions, and appends the approvals
// inbox's events of the refusals' requests, all in the gate's transaction
// (so the COMMIT goes in a round trip of its own: the events are written
// only once the decisions are known).
func (s *Service) readDecisions(ctx context.Context, c groupConn, b *pgx.Batch, spenders, dropped []*member) error {
	br := db.SendBatch(ctx, c, b)
	defer br.Close()
	for range dropped {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("delete refused wake-ups: %w", err)
		}
	}
	for _, m := range spenders {
		var decided bool
		var err error
		if m.res, decided, err = m.spend.Read(br); err != nil {
			return fmt.Errorf("spend for wake-up: %w", err)
		}
		if !decided {
			// The key names the intent's fresh id: it cannot have been used.
			return fmt.Errorf("spend for wake-up %s: its idempotency key was used before", m.id)
		}
	}
	for range spenders {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("mark refused wake-ups: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	// (joined as a transaction: code that joins a pgx.Tx, as an approval
	// webhook's enqueue does, would begin and commit its own on the bare
	// connection, committing the group's half done: db.JoinedTx)
	qs, res := make([]*mandates.QueuedSpend, len(spenders)), make([]mandates.SpendResult, len(spenders))
	for i, m := range spenders {
		qs[i], res[i] = m.spend, m.res
	}
	if err := mandates.AppendRequestedAll(ctx, db.JoinedTx(c.Conn), qs, res); err != nil {
		return fmt.Errorf("spend for wake-up: %w", err)
	}
	return nil
}

// readLocked marks funded the members qLockFunded found still funded.
func readLocked(br pgx.BatchResults, ms []*member) error {
	for _, m := range ms {
		err := br.QueryRow().Scan(&m.funded)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	return nil
}

// markFundedAlone makes the granted members' enqueue their own business.
func markFundedAlone(spenders []*member) {
	for _, m := range spenders {
		m.funded = false
	}
}

// enqueueGroup is the second transaction for the group's funded intents:
// their work is enqueued (one NOTIFY per pool) and they are marked
// enqueued, and it commits. An intent it cannot enqueue is enqueued alone
// (as a request alone does), and failing that left to the reconciler.
func (s *Service) enqueueGroup(ctx context.Context, c groupConn, ms []*member) {
	var granted, funded []*member
	for _, m := range ms {
		if !m.answered && m.spend != nil && m.res.OK {
			granted = append(granted, m)
		}
	}
	crashed := map[*member]error{}
	if hook := s.cfg.BeforeEnqueue; hook != nil {
		// Between the gate's commit and the enqueue, as a crash there would
		// be: an intent the hook fails stays funded, for the reconciler
		// (answered once this transaction no longer locks it).
		for _, m := range granted {
			if err := hook(ctx, m.id); err != nil {
				m.funded = false
				crashed[m] = fmt.Errorf("wake-up %s is funded; its work will be enqueued by the reconciler: %w", m.id, err)
			}
		}
	}
	for _, m := range granted {
		if m.funded {
			funded = append(funded, m)
		}
	}
	if len(funded) > 0 {
		if err := s.enqueueFundedGroup(ctx, c, funded); err != nil {
			c.rollback(ctx)
			s.logger.Warn("enqueueing a group of funded wake-ups failed; enqueueing them one by one", "wakeups", len(funded), "error", err.Error())
			markFundedAlone(funded)
		}
	} else {
		c.rollback(ctx) // the second transaction, if it began, has nothing to do
	}
	for _, m := range granted {
		switch {
		case crashed[m] != nil:
			m.answer(createReply{w: m.wakeup(), err: crashed[m]})
		case m.funded:
			m.answer(createReply{w: m.wakeup()})
		default:
			m.answer(s.enqueueAlone(ctx, m.req.p.OrgID, m.id, m.wakeup()))
		}
	}
}

// enqueueAlone is transaction 2 for one intent, answered as Create answers
// a request alone: a failure is logged and left to the reconciler.
func (s *Service) enqueueAlone(ctx context.Context, orgID string, id uuid.UUID, w Wakeup) createReply {
	if _, err := s.enqueueFunded(ctx, orgID, id); err != nil {
		s.logger.Warn("enqueue after the gate failed; the reconciler will retry", "org_id", orgID, "wakeup_id", id, "error", err)
		return createReply{w: w}
	}
	got, err := s.Get(ctx, orgID, AnyAgent, id)
	if err != nil {
		return createReply{w: w}
	}
	return createReply{w: got}
}

// enqueueFundedGroup enqueues the locked intents' work in the open second
// transaction, marks them enqueued and commits, in one round trip. Should
// the enqueue insert nothing (a pool dropped since the check), the marks,
// which test for the work, mark nothing either, and the intents stay
// funded.
func (s *Service) enqueueFundedGroup(ctx context.Context, c groupConn, funded []*member) error {
	ps := make([]workpool.EnqueueParams, len(funded))
	for i, m := range funded {
		ps[i] = s.enqueueParams(m.req.p.OrgID, m.id, m.req.p.Pool, m.req.p.Work)
	}
	b := &pgx.Batch{}
	q, err := s.pool.QueueEnqueue(b, ps)
	if err != nil {
		return fmt.Errorf("enqueue wake-up work: %w", err)
	}
	for i, m := range funded {
		b.Queue(qMarkEnqueued, m.req.p.OrgID, m.id, q.IDs[i])
	}
	b.Queue("COMMIT")
	br := db.SendBatch(ctx, c, b)
	defer br.Close()
	if err := q.Read(br); err != nil && !errors.Is(err, workpool.ErrNotEnqueued) {
		return fmt.Errorf("enqueue wake-up work: %w", err)
	}
	marked := make([]time.Time, len(funded))
	for i := range funded {
		err := br.QueryRow().Scan(&marked[i])
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("mark wake-ups enqueued: %w", err)
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return fmt.Errorf("committing the wake-ups' enqueue: %w", err)
	}
	for i, m := range funded {
		if marked[i].IsZero() {
			m.funded = false // still funded: enqueued alone
			continue
		}
		m.workID, m.updatedAt = q.IDs[i], marked[i]
	}
	return br.Close()
}
