package workpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/reveille/reveille/internal/leader"
)

// ErrTooManyPending is returned when an enqueue would take an org past its
// cap of unfinished work in a pool (Config.MaxPendingPerOrg); the error
// that wraps it names the org, the pool and the cap. Nothing is enqueued.
// Retry once some of the org's work there has finished.
var ErrTooManyPending = errors.New("too much pending work")

const (
	// pendingRecountAfter is how long a count that found an org over its
	// cap holds off the next one on this replica, so that an org hammering
	// a full pool costs one count a second, not one per request.
	pendingRecountAfter = time.Second
	// pendingRefreshAfter is how stale a count gets before the pool's
	// leader counts again (pendingRefreshBatch orgs per purge tick): it
	// keeps the bound close and repairs one that drifted low, e.g. counts
	// not kept while the cap was off.
	pendingRefreshAfter = time.Minute
	pendingRefreshBatch = 100
)

// Pending counts (workpool_org_pending) bound an org's unfinished work in
// a pool from above, or at least reach cap+1 (an exact count stops there):
// the count taken at counted_at plus what was enqueued since. Finishing work does not lower
// it (a row every completion updated would serialise an org's completions
// with its enqueues, and hold up the loop behind an enqueuing transaction),
// so an enqueue that finds the bound past the cap counts again before it
// refuses — however recent the stored count: the enqueues since may all
// have finished. Only a count that refused holds the next one off, and
// only for enqueues that would not have fit beside what it found. Every
// count that sets the bound moves counted_at forward (sqlSetPending), so
// a reader can tell whether the bound was counted again since it last
// read it: between counts, the bound grows by exactly what was enqueued.

// refusalLog remembers, per (pool, org), this replica's last count that
// refused an enqueue or a check: when, and how much unfinished work it
// found. The count a refused enqueue takes rolls back with it, so the
// table cannot remember it.
type refusalLog struct {
	mu   sync.Mutex
	last map[[2]string]refusal
}

type refusal struct {
	at    time.Time
	found int64 // the org's unfinished work the count found (at most cap+1)
}

// heldOff reports whether a count of (pool, org) within
// pendingRecountAfter of now found too much work for n more items under
// limit: they are refused again without a count, and found is what it
// found. A count that refused a batch for its own size — the org had room
// for fewer — holds off no enqueue that fits that room.
func (r *refusalLog) heldOff(pool, org string, n, limit int64, now time.Time) (found int64, held bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.last[[2]string{pool, org}]
	if !ok || now.Sub(e.at) >= pendingRecountAfter || e.found+n <= limit {
		return 0, false
	}
	return e.found, true
}

// refused records a count of (pool, org) at now that refused what it was
// asked to admit: it found found items unfinished.
func (r *refusalLog) refused(pool, org string, found int64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[[2]string]refusal{}
	}
	if len(r.last) >= 10_000 { // orgs over their caps at once: forget the stale ones
		for k, e := range r.last {
			if now.Sub(e.at) >= pendingRecountAfter {
				delete(r.last, k)
			}
		}
	}
	r.last[[2]string{pool, org}] = refusal{at: now, found: found}
}

// admitLog remembers, per (pool, org), this replica's last check
// (PendingCheck.Decide) whose count admitted, so that the next checks need
// not count while what was enqueued since still fits the room it found.
// The check stores no count in the table (without the row's lock it could
// miss an enqueue in flight), and the enqueues that follow admitted
// checks bypass the cap and store none either: without this log, every
// check would count while the bound stays past the cap — up to
// pendingRefreshAfter, until the leader counts.
type admitLog struct {
	mu   sync.Mutex
	last map[[2]string]admission
}

// admission is a check's count that admitted, taken at at: it found found
// items unfinished, after the check read the stored bound (bound, counted
// at countedAt).
type admission struct {
	at        time.Time
	found     int64
	bound     int64
	countedAt time.Time
}

// admitLogSize bounds the log: past it, entries older than
// pendingRefreshAfter go first, then any.
const admitLogSize = 10_000

// admits reports whether n more items of (pool, org) fit under limit
// given the stored bound just read (bound, counted at countedAt), without
// a count: the last admitting count found e.found items, and the bound
// has grown by bound−e.bound since — which counts every item enqueued since
// (bypassing ones too), as long as no count set the bound meanwhile
// (counted_at unchanged; a count that lowers it could be followed by
// enqueues that take it back past e.bound). So found+(bound−e.bound)
// bounds the org's unfinished work from above.
func (a *admitLog) admits(pool, org string, bound int64, countedAt time.Time, limit, n int64, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.last[[2]string{pool, org}]
	return ok && now.Sub(e.at) < pendingRefreshAfter && e.countedAt.Equal(countedAt) &&
		bound >= e.bound && e.found+(bound-e.bound)+n <= limit
}

// admitted records a check's count that admitted.
func (a *admitLog) admitted(pool, org string, e admission) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[[2]string]admission{}
	}
	k := [2]string{pool, org}
	if _, ok := a.last[k]; !ok && len(a.last) >= admitLogSize {
		for k, old := range a.last {
			if e.at.Sub(old.at) >= pendingRefreshAfter {
				delete(a.last, k)
			}
		}
		for k := range a.last { // still full: any one goes
			if len(a.last) < admitLogSize {
				break
			}
			delete(a.last, k)
		}
	}
	a.last[k] = e
}

// forget drops (pool, org)'s admission: a count found it full.
func (a *admitLog) forget(pool, org string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.last, [2]string{pool, org})
}

// pendingGroups are a batch's fresh items per (pool, org), sorted, so that
// every batch locks the counts in one order.
type pendingGroups struct {
	pools, orgs []string
	counts      []int64
	// The groups the cap applies to (some item is not BypassPendingCap),
	// also as "pool/org".
	checkPools, checkOrgs, checkKeys []string
	checked                          []bool
}

func (g *pendingGroups) index(pool, org string) int {
	for i := range g.pools {
		if g.pools[i] == pool && g.orgs[i] == org {
			return i
		}
	}
	return -1
}

func (m *Manager) capOn() bool { return m.cfg.MaxPendingPerOrg != NoPendingLimit }

// pendingGroups returns nil when the cap is off.
func (m *Manager) pendingGroups(ps []EnqueueParams, r *enqueueRows) *pendingGroups {
	if !m.capOn() {
		return nil
	}
	type key struct{ pool, org string }
	counts := map[key]int64{}
	checked := map[key]bool{}
	for i, p := range ps {
		if r.replay != nil && r.replay[i] {
			continue
		}
		k := key{p.Pool, p.OrgID}
		counts[k]++
		checked[k] = checked[k] || !p.BypassPendingCap
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.pool, b.pool), cmp.Compare(a.org, b.org)) })
	g := &pendingGroups{}
	for _, k := range keys {
		g.pools, g.orgs, g.counts = append(g.pools, k.pool), append(g.orgs, k.org), append(g.counts, counts[k])
		g.checked = append(g.checked, checked[k])
		if checked[k] {
			g.checkPools, g.checkOrgs = append(g.checkPools, k.pool), append(g.checkOrgs, k.org)
			g.checkKeys = append(g.checkKeys, k.pool+"/"+k.org)
		}
	}
	return g
}

// pendingCount is a pair's row of workpool_org_pending.
type pendingCount struct {
	pool, org string
	pending   int64
}

// admitOverCap decides the groups whose bound went past the cap, after an
// insert that inserted nothing: each is counted again (unless a count
// within pendingRecountAfter found too much work for its items beside)
// and refused if its items would really take it past the cap, else its
// exact count is stored. tx holds
// the counts' row locks (the insert raised them), so the count sees every
// enqueue of the org that committed and none is in flight.
func (m *Manager) admitOverCap(ctx context.Context, tx pgx.Tx, g *pendingGroups) error {
	if len(g.checkPools) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, sqlReadPendingPairs, g.checkPools, g.checkOrgs)
	if err != nil {
		return fmt.Errorf("reading pending counts: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingCount, error) {
		var c pendingCount
		err := r.Scan(&c.pool, &c.org, &c.pending)
		return c, err
	})
	if err != nil {
		return fmt.Errorf("reading pending counts: %w", err)
	}
	limit := int64(m.cfg.MaxPendingPerOrg)
	now := m.now()
	for _, c := range counts {
		i := g.index(c.pool, c.org)
		if i < 0 || !g.checked[i] || c.pending <= limit {
			continue
		}
		if found, held := m.refusals.heldOff(c.pool, c.org, g.counts[i], limit, now); held {
			return m.refuse(c.pool, c.org, found, g.counts[i])
		}
		exact, err := m.countPending(ctx, tx, c.pool, c.org)
		if err != nil {
			return err
		}
		if exact+g.counts[i] > limit {
			m.refusals.refused(c.pool, c.org, exact, now)
			return m.refuse(c.pool, c.org, exact, g.counts[i])
		}
		if _, err := tx.Exec(ctx, sqlSetPending, c.pool, c.org, exact+g.counts[i], now); err != nil {
			return fmt.Errorf("updating the pending count of %s in %s: %w", c.org, c.pool, err)
		}
	}
	return nil
}

// countPending counts an org's unfinished work in a pool, up to cap+1
// (enough to decide).
func (m *Manager) countPending(ctx context.Context, q Querier, pool, org string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, sqlCountPending, pool, org, int64(m.cfg.MaxPendingPerOrg)+1).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the pending work of %s in %s: %w", org, pool, err)
	}
	return n, nil
}

// refuse counts a refusal of items, found being the org's unfinished work
// a count found, and says why: the org is at its cap, or the items would
// not fit beside its work.
func (m *Manager) refuse(pool, org string, found, items int64) error {
	m.metrics.refused.WithLabelValues(pool).Add(float64(items))
	limit := int64(m.cfg.MaxPendingPerOrg)
	if found+1 > limit {
		return fmt.Errorf("org %s has reached its cap of %d unfinished work items in pool %s: %w",
			org, limit, pool, ErrTooManyPending)
	}
	return fmt.Errorf("org %s has %d unfinished work items in pool %s; %d more would pass its cap of %d: %w",
		org, found, pool, items, limit, ErrTooManyPending)
}

// CheckPending reports ErrTooManyPending when one more item would take
// orgID past its cap in pool, without writing anything. Callers that act
// before they enqueue — the wake-up gate spends money first — use it to
// refuse before acting; their later enqueue may then set BypassPendingCap.
func (m *Manager) CheckPending(ctx context.Context, q Querier, orgID, pool string) error {
	if !m.capOn() {
		return nil
	}
	c := &PendingCheck{m: m, org: orgID, pool: pool}
	if err := c.scan(q.QueryRow(ctx, sqlReadPending, pool, orgID)); err != nil {
		return err
	}
	return c.Decide(ctx, q)
}

// PendingCheck is CheckPending for a caller that sends the read in a batch
// of its own, beside statements of its own (the wake-up gate's first round
// trip): QueuePendingCheck queues the read, Read takes its row from the
// batch's results, and Decide decides once the batch is closed. A nil
// check (the cap is off) reads and decides nothing.
type PendingCheck struct {
	m         *Manager
	org, pool string
	found     bool // the pair has a count
	pending   int64
	countedAt time.Time
}

// QueuePendingCheck queues in b the read of orgID's pending count in pool;
// nil when the cap is off.
func (m *Manager) QueuePendingCheck(b *pgx.Batch, orgID, pool string) *PendingCheck {
	if !m.capOn() {
		return nil
	}
	b.Queue(sqlReadPending, pool, orgID)
	return &PendingCheck{m: m, org: orgID, pool: pool}
}

// Read takes the count from br, in b's queue order.
func (c *PendingCheck) Read(br pgx.BatchResults) error {
	if c == nil {
		return nil
	}
	return c.scan(br.QueryRow())
}

func (c *PendingCheck) scan(row pgx.Row) error {
	err := row.Scan(&c.pending, &c.countedAt)
	c.found = err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("reading the pending count of %s in %s: %w", c.org, c.pool, err)
	}
	return nil
}

// Decide reports ErrTooManyPending when one more item would take the org
// past its cap. A bound past the cap is counted again on q first, unless
// a count found the org at its cap within pendingRecountAfter (refused
// without a count), or this replica's last check that counted and
// admitted shows room for what was enqueued since (admitted without a
// count: admitLog). The count is not stored in the table: without the
// count's row lock it could miss an enqueue in flight. The enqueue that
// follows an admitted check stores nothing either — it bypasses the cap —
// so while the bound stays past the cap the checks count again each time
// the enqueues since the last count use up the room it found.
func (c *PendingCheck) Decide(ctx context.Context, q Querier) error {
	_, err := c.DecideN(ctx, q, 1)
	return err
}

// DecideN is Decide for n items checked together (a group of wake-up
// requests of one org and pool, each an item): room is how many of them
// fit, the first ones admitted; when room < n, err wraps
// ErrTooManyPending for the rest (each counted as refused). Any other
// error admits none.
func (c *PendingCheck) DecideN(ctx context.Context, q Querier, n int64) (room int64, err error) {
	if n <= 0 {
		return 0, nil // (nothing to admit, and nothing refused to count)
	}
	if c == nil || !c.found && n <= 1 {
		// (no count yet: nothing was enqueued; for more than one item
		// c.pending, 0, is checked below like any count)
		return n, nil
	}
	m := c.m
	limit := int64(m.cfg.MaxPendingPerOrg)
	if c.pending+n <= limit {
		return n, nil
	}
	// refuse refuses the items past the first room, each request an item.
	refuse := func(found, room int64) (int64, error) {
		if room == 0 {
			err := m.refuse(c.pool, c.org, found, 1)
			m.metrics.refused.WithLabelValues(c.pool).Add(float64(n - 1))
			return 0, err
		}
		// (the room went to the items ahead of these in the group, whether
		// or not they end up enqueued: refused, retry)
		m.metrics.refused.WithLabelValues(c.pool).Add(float64(n - room))
		return room, fmt.Errorf("org %s has %d unfinished work items in pool %s, and the first %d requests of this one's group took the room left under its cap of %d: %w",
			c.org, found, c.pool, room, limit, ErrTooManyPending)
	}
	now := m.now()
	if found, held := m.refusals.heldOff(c.pool, c.org, 1, limit, now); held {
		return refuse(found, 0)
	}
	if m.admits.admits(c.pool, c.org, c.pending, c.countedAt, limit, n, now) {
		return n, nil
	}
	found, err := m.countPending(ctx, q, c.pool, c.org)
	if err != nil {
		return 0, err
	}
	if found+1 <= limit {
		m.admits.admitted(c.pool, c.org, admission{at: now, found: found, bound: c.pending, countedAt: c.countedAt})
		if found+n <= limit {
			return n, nil
		}
		return refuse(found, limit-found) // the first limit−found fit; the rest are refused
	}
	m.admits.forget(c.pool, c.org)
	m.refusals.refused(c.pool, c.org, found, now)
	return refuse(found, 0)
}

// refreshPending counts again the pool's stalest counts (the leader, on
// its purge tick). Each count locks its row first, so that it sees every
// enqueue that committed before and none runs meanwhile.
func (l *loop) refreshPending(ctx context.Context) error {
	m := l.m
	if !m.capOn() {
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, m.cfg.StatementTimeout) // (see Config.StatementTimeout)
	defer cancel()
	rows, err := m.db.Query(fctx, sqlStalePending, l.pool, m.now().Add(-pendingRefreshAfter), pendingRefreshBatch)
	if err != nil {
		return fmt.Errorf("finding stale pending counts of pool %s: %w", l.pool, err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("finding stale pending counts of pool %s: %w", l.pool, err)
	}
	for _, org := range orgs {
		err := leader.FencedTx(ctx, m.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlLockPending, l.pool, org); err != nil {
				return fmt.Errorf("locking the pending count of %s in %s: %w", org, l.pool, err)
			}
			n, err := m.countPending(ctx, tx, l.pool, org)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, sqlSetPending, l.pool, org, n, m.now()); err != nil {
				return fmt.Errorf("updating the pending count of %s in %s: %w", org, l.pool, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
