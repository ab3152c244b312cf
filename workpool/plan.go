package workpool

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The planned fair start. While a pool's backlog of several orgs burns
// down, the fair pick's inputs barely change between starts: the same
// orgs are due, their weights and turns are the loop's, and the slots
// each holds move only by the loop's own starts and the completions this
// replica records. The loop keeps them (a fairView, read once), works out
// in Go how far down each org's queue the next start can reach, and
// sends a statement that checks the view still holds — the slots held
// per org, the due queues, the settings — and starts those items (each
// org's next, as the loop read them ahead: sqlReadAhead) in the fair
// order (sqlTurnOrder, which the loop works out as Postgres would: args),
// as the near pick does. Slots held that the view missed
// (completions not handed over to it) are recounted from the statement's
// snapshot and the start planned again; when anything else changed (work
// enqueued, retried or handed back for a due org, a setting, keyed work)
// the statement starts nothing and the loop falls back to the near pick
// at once; it reads a new view after a few fair starts (more after each
// miss in a row, or at once after a full iteration dropped one that
// held). The pick is the near pick's whenever the view holds:
// the same candidates ranked by the same order
// (TestPlannedStart_StartsWhatTheFullFairPickStarts); what it saves is
// the near pick's SQL work of deriving them, and the reads themselves
// (docs/benchmarks.md § pool, "Planned fair starts").

// fairView is what a planned start assumes (sqlFairView): the slots each
// org held at the snapshot it was read in, plus the loop's own starts
// since; each due org with ready work, its weight and where its ready
// work begins; the due queues as read (sqlQueueSeen); and the pool's
// settings' version.
type fairView struct {
	snap    pgSnapshot
	maxPar  int64
	version int64
	running map[string]int64
	orgs    map[string]*viewOrg
	names   []string // orgs' names, in byte order
	// emptied: the orgs whose ready work the planned starts took all of
	// (off orgs and names; their queues go, or move to their next item,
	// with the view: dropView)
	emptied map[string]*viewOrg
	queues  []string // each due queue, as sqlQueueSeen renders it
	// until: when a not-ready org's next item or a queue not yet due comes
	// due (zero: none); the view says nothing of them, so it is read again
	// then
	until time.Time
}

// viewOrg is a due org with ready work: its weight, a time at or before
// its first ready item (where the next read begins), its queue row's
// version as the view read it (the head goes back to the row only if no
// one wrote it since: dropView), and its next ready items as last read
// (ahead: a prefix of its ready work, in the order a read from the head
// takes it, less what the planned starts took since).
type viewOrg struct {
	weight int64
	place  int64 // among the view's orgs, in the order of org ids the fair order ends with
	head   time.Time
	seen   string
	moved  bool // head is past the row's
	ahead  []aheadItem
	// exhausted: ahead holds all its ready work (a read ahead found less
	// than it asked for); next is then its first item not yet due (nil:
	// none)
	exhausted bool
	next      *time.Time
}

// aheadItem is a ready item read ahead: its tuple, id and run_at. (Ids
// here are [16]byte, as pgUUIDs: pgx reads and writes a uuid.UUID through
// database/sql's Scanner and Valuer, which cost the loop more than
// anything else it does per planned item.)
type aheadItem struct {
	tid   pgtype.TID
	id    [16]byte
	runAt time.Time
}

// readAheadOf is how many items a read ahead takes of an org a start
// takes n of: enough for several starts (most then read nothing), within
// a bound (a start of many orgs reads little of each).
func readAheadOf(n int32) int32 {
	return max(n, min(8*n, 256))
}

// completedBatch is a batch of attempts this replica recorded for a pool:
// its transaction and the slots it freed per org. A planned view counts
// it once: already in the view when its transaction is visible in the
// view's snapshot, else taken off the view's counts.
type completedBatch struct {
	xid  uint64
	orgs map[string]int64
}

// completedKept bounds the batches a loop keeps for its next view (a
// pool that never plans would otherwise keep every one).
const completedKept = 256

// planBackoffMax bounds the fair starts a loop makes on the near pick
// after planned starts missed, before it reads a view again.
const planBackoffMax = 256

// noteCompleted hands the leading loops of this replica the slots a
// committed batch freed (rows as recorded: each left 'running').
func (m *Manager) noteCompleted(rows []finishedRow) {
	for pool, b := range completedBatches(rows) {
		if l := m.loopFor(pool); l != nil && l.leading.Load() {
			l.noteCompleted(b)
		}
	}
}

// completedBatches are a recorded batch's rows by pool.
func completedBatches(rows []finishedRow) map[string]completedBatch {
	byPool := map[string]completedBatch{}
	for _, r := range rows {
		if r.xid <= 0 {
			continue
		}
		b, ok := byPool[r.pool]
		if !ok {
			b = completedBatch{xid: uint64(r.xid), orgs: map[string]int64{}}
		}
		b.orgs[r.orgID]++
		byPool[r.pool] = b
	}
	return byPool
}

// noteCompleted keeps a recorded batch for the loop's next planned start.
func (l *loop) noteCompleted(b completedBatch) {
	l.completedMu.Lock()
	defer l.completedMu.Unlock()
	if len(l.completed) >= completedKept {
		l.completed = slices.Delete(l.completed, 0, len(l.completed)-completedKept+1)
	}
	l.completed = append(l.completed, b)
}

// foldCompleted takes the batches recorded since the last fold off the
// view's counts (those its snapshot did not see).
func (l *loop) foldCompleted(v *fairView) {
	l.completedMu.Lock()
	batches := l.completed
	l.completed = nil
	l.completedMu.Unlock()
	for _, b := range batches {
		if v.snap.sees(b.xid) {
			continue
		}
		for org, n := range b.orgs {
			if v.running[org] -= n; v.running[org] <= 0 {
				delete(v.running, org)
			}
		}
	}
}

// pgSnapshot is a Postgres snapshot (pg_current_snapshot()).
type pgSnapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

func parseSnapshot(s string) (pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var snap pgSnapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			xid, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
			}
			snap.xip = append(snap.xip, xid)
		}
	}
	return snap, nil
}

// sees says whether a committed transaction's effects are visible in the
// snapshot.
func (s pgSnapshot) sees(xid uint64) bool {
	return xid < s.xmin || xid < s.xmax && !slices.Contains(s.xip, xid)
}

// sqlQueueSeen renders a due queue row q for a view's check: the org and
// the row's version. Every writer of the row changes it — an enqueue, a
// retry or a hand-back of the org's plain work — and any of them may add
// work before where the view reads the org from, or ready work to an org
// the view holds has none.
const sqlQueueSeen = `q.org_id || ':' || q.xmin::text`

// sqlFairView reads a planned view of pool $1 at $2: settings, snapshot,
// slots held per org, the due orgs with ready work (each with its weight,
// first ready item, queue row's version and place among the orgs in the
// fair order's last term), the due queues as
// sqlQueueSeen renders them, the next item of the due orgs without ready
// work, and whether keyed work is ready. (Orgs in byte order, as the loop
// sorts them.)
var sqlFairView = `
WITH ` + sqlRunningByOrg + `,
queued AS (
  SELECT q.org_id, q.head_at, q.xmin, h.run_at AS first_at, coalesce(wt.weight, 1)::bigint AS weight
  FROM workpool_org_queues q
  LEFT JOIN workpool_org_weights wt ON wt.pool = $1 AND wt.org_id = q.org_id
  LEFT JOIN LATERAL (
    SELECT w.run_at FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = q.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
      AND w.run_at >= q.head_at AND w.run_at <= $2
    ORDER BY w.run_at LIMIT 1) h ON true
  WHERE q.pool = $1 AND q.head_at <= $2
)
SELECT p.max_parallelism::bigint, p.max_parallelism_per_org IS NULL, p.settings_version, pg_current_snapshot()::text,
  coalesce((SELECT array_agg(org_id ORDER BY org_id COLLATE "C") FROM running), '{}'),
  coalesce((SELECT array_agg(n ORDER BY org_id COLLATE "C") FROM running), '{}'),
  coalesce((SELECT array_agg(org_id ORDER BY org_id COLLATE "C") FROM queued WHERE first_at IS NOT NULL), '{}'),
  coalesce((SELECT array_agg(first_at ORDER BY org_id COLLATE "C") FROM queued WHERE first_at IS NOT NULL), '{}'),
  coalesce((SELECT array_agg(weight ORDER BY org_id COLLATE "C") FROM queued WHERE first_at IS NOT NULL), '{}'),
  coalesce((SELECT array_agg(xmin::text ORDER BY org_id COLLATE "C") FROM queued WHERE first_at IS NOT NULL), '{}'),
  -- (each one's place in the order the fair pick breaks ties by: the
  -- column's collation, which the loop cannot know)
  coalesce((SELECT array_agg(place ORDER BY org_id COLLATE "C")
            FROM (SELECT org_id, rank() OVER (ORDER BY org_id) AS place FROM queued WHERE first_at IS NOT NULL) r), '{}'),
  coalesce((SELECT array_agg(` + sqlQueueSeen + ` ORDER BY q.org_id COLLATE "C") FROM queued q), '{}'),
  least((SELECT min((SELECT min(w.run_at) FROM workpool_work w
     WHERE w.pool = $1 AND w.org_id = q.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL AND w.run_at > $2))
   FROM queued q WHERE q.first_at IS NULL),
   -- (a queue coming due changes the due queues the planned start checks)
   (SELECT min(head_at) FROM workpool_org_queues WHERE pool = $1 AND head_at > $2)),
  ` + sqlKeyedReady + ` IS NOT NULL
FROM workpool_pools p WHERE p.name = $1`

// errCannotPlan says that a pool cannot plan: it has a per-org cap, or
// keyed work is ready.
var errCannotPlan = errors.New("the pool cannot plan its fair starts")

// readView reads a planned view of the pool: nil when fewer than two
// orgs have ready work (nothing to plan now), errCannotPlan when the pool
// cannot plan.
func (l *loop) readView(ctx context.Context, now time.Time) (*fairView, error) {
	var (
		v                  = &fairView{running: map[string]int64{}, orgs: map[string]*viewOrg{}}
		noCap, keyed       bool
		snap               string
		runOrgs, readyOrgs []string
		runN, weights      []int64
		places             []int64
		heads              []time.Time
		seen               []string
		until              *time.Time
	)
	ctx, cancel := context.WithTimeout(ctx, l.m.cfg.StatementTimeout)
	defer cancel()
	err := l.m.db.QueryRow(ctx, sqlFairView, l.pool, now).Scan(&v.maxPar, &noCap, &v.version, &snap,
		&runOrgs, &runN, &readyOrgs, &heads, &weights, &seen, &places, &v.queues, &until, &keyed)
	if err != nil {
		return nil, fmt.Errorf("reading pool %s's fair view: %w", l.pool, err)
	}
	if !noCap || keyed {
		return nil, errCannotPlan
	}
	if len(readyOrgs) < 2 {
		return nil, nil
	}
	if v.snap, err = parseSnapshot(snap); err != nil {
		return nil, err
	}
	for i, org := range runOrgs {
		v.running[org] = runN[i]
	}
	for i, org := range readyOrgs {
		v.orgs[org] = &viewOrg{weight: max(weights[i], 1), head: heads[i], seen: seen[i], place: places[i]}
	}
	v.names = readyOrgs // (in byte order: COLLATE "C")
	if until != nil {
		v.until = *until
	}
	return v, nil
}

// fairPlan is a planned start's candidates: each org with its weight,
// the slots it holds, its position less one (vrun, as sqlTurnsHeld), the
// starts charged to it as the pick counts them (served, sqlServed) and
// how far down its queue the start may reach (n).
type fairPlan struct {
	orgs                           []string
	n                              []int32
	weights, running, vrun, served []int64
	free                           int64
}

// plan works out the next start's reads from the view and the turns:
// the free slots' worth of first candidates in the fair order, by turn
// and slots held (sqlTurnOrder's first two terms), and every candidate
// tied with the last of them — run_at and the org, which break those
// ties, are compared when args orders the candidates.
func (v *fairView) plan(t *fairTurns) fairPlan {
	used := int64(0)
	for _, n := range v.running {
		used += n
	}
	return v.planFree(t, max(v.maxPar-used, 0))
}

// planFree is plan for free slots as given.
func (v *fairView) planFree(t *fairTurns, free int64) fairPlan {
	p := fairPlan{free: free}
	orgs := v.names
	den := max(t.den, 1)
	h := make(candHeap, 0, len(orgs))
	for i, org := range orgs {
		o := v.orgs[org]
		clock := (t.num*o.weight + den - 1) / den
		var line int64
		if tl, ok := t.orgs[org]; ok && int64(tl.weight) == o.weight {
			line = tl.served
		}
		r := v.running[org]
		avail := int64(math.MaxInt64)
		if o.exhausted {
			avail = int64(len(o.ahead))
		}
		h = append(h, cand{org: i, k: 1, vrun: max(line, clock+r) - 1, served: max(line, clock), running: r, weight: o.weight,
			avail: avail, out: avail == 0})
	}
	n := make([]int32, len(orgs))
	if p.free > 0 && len(h) > 0 {
		heap.Init(&h)
		var last cand
		for taken := int64(0); !h[0].out && (taken < p.free || h[0].key1() == last.key1() && h[0].key2() == last.key2()); taken++ {
			last = h[0]
			n[last.org]++
			h[0].k++
			h[0].out = h[0].k > h[0].avail // (an exhausted org has no more)
			heap.Fix(&h, 0)
		}
	}
	// only the orgs the start reads go to the statement (h holds each org
	// once, in some order; its k moved on, the rest as planned)
	for _, c := range h {
		if n[c.org] == 0 {
			continue
		}
		org := orgs[c.org]
		p.orgs, p.n = append(p.orgs, org), append(p.n, n[c.org])
		p.weights, p.running = append(p.weights, c.weight), append(p.running, c.running)
		p.vrun, p.served = append(p.vrun, c.vrun), append(p.served, c.served)
	}
	return p
}

// cand is an org's k-th candidate in the plan's merge of the orgs' queues
// (out: it has no k-th, of avail).
type cand struct {
	org                                     int
	k, vrun, served, running, weight, avail int64
	out                                     bool
}

func (c cand) key1() float64 { return float64(c.vrun+c.k) / float64(c.weight) }
func (c cand) key2() float64 { return float64(c.running+c.k) / float64(c.weight) }

type candHeap []cand

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if h[i].out != h[j].out {
		return !h[i].out
	}
	if a, b := h[i].key1(), h[j].key1(); a != b {
		return a < b
	}
	if a, b := h[i].key2(), h[j].key2(); a != b {
		return a < b
	}
	return h[i].org < h[j].org
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(cand)) }
func (h *candHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// sqlReadAhead reads ahead each org $2 from its head $3: its first $4
// ready plain items due at $5, in the order every read of its queue takes
// them (run_at, then the index's order), and, when it has fewer, when its
// next item comes due (null: none pending). The arrays are aggregated in
// one pass over the ordered subquery, so they are aligned and keep its
// order (an aggregate over a sorted subquery with nothing between them
// takes its rows in that order; an ORDER BY in each aggregate, or a
// row_number to order by, sorted each org's items three times more: a
// third of the statement).
const sqlReadAhead = `
SELECT u.org_id, c.tids, c.ids, c.run_ats, cardinality(c.ids) < u.n,
  CASE WHEN cardinality(c.ids) < u.n THEN (SELECT min(w.run_at) FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = u.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL AND w.run_at > $5) END
FROM unnest($2::text[], $3::timestamptz[], $4::int[]) AS u(org_id, head_at, n)
CROSS JOIN LATERAL (
  SELECT coalesce(array_agg(x.tid), '{}') AS tids, coalesce(array_agg(x.id), '{}') AS ids,
    coalesce(array_agg(x.run_at), '{}') AS run_ats
  FROM (
    SELECT w.ctid AS tid, w.id, w.run_at FROM workpool_work w
    WHERE w.pool = $1 AND w.org_id = u.org_id AND w.state = 'pending' AND w.concurrency_key IS NULL
      AND w.run_at >= u.head_at AND w.run_at <= $5
    ORDER BY w.run_at LIMIT u.n) x) c`

// sqlIterateFastPlanned is a fair fast iteration from the loop's plan
// (fairPlan, fairView): the fence, then — when the view holds (verdict:
// the slots held per org, the due queues and the settings' version are
// as the loop expects, and no keyed work is ready) — the free slots'
// worth of the planned items (each org's first, as read ahead, in the
// fair order: args) started, each found by its tuple and checked to be
// the item read ahead and still ready. $9–$10 the planned items in the
// fair order (tuple, id), $11–$12 the slots held per org expected (orgs
// in byte order, counts), $13 the due queues expected (sqlQueueSeen), $14
// the settings' version; the rest as every start, $8 the generation.
var sqlIterateFastPlanned = `
WITH bump AS (` + bumpSQL("$8", "$2") + `
), cand AS (
  SELECT * FROM unnest($9::tid[], $10::uuid[]) WITH ORDINALITY AS c(tid, id, place)
), ` + sqlRunningByOrg + `, held AS (
  -- the slots held per org as this snapshot has them (returned: a view
  -- that missed only completions not yet handed over takes them)
  SELECT coalesce((SELECT array_agg(org_id ORDER BY org_id COLLATE "C") FROM running), '{}') AS orgs,
    coalesce((SELECT array_agg(n ORDER BY org_id COLLATE "C") FROM running), '{}') AS n
), rest AS (
  SELECT coalesce((SELECT settings_version FROM bump) = $14::bigint
    AND coalesce((SELECT array_agg(` + sqlQueueSeen + ` ORDER BY q.org_id COLLATE "C")
                  FROM workpool_org_queues q WHERE q.pool = $1 AND q.head_at <= $2), '{}') = $13::text[]
    AND ` + sqlKeyedReady + ` IS NULL, false) AS ok
), verdict AS (
  SELECT (SELECT ok FROM rest) AND h.orgs = $11::text[] AND h.n = $12::bigint[] AS ok FROM held h
), free AS (
  SELECT CASE WHEN NOT coalesce((SELECT paused FROM bump), true) AND (SELECT ok FROM verdict)
      AND NOT EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1)
    THEN ` + sqlFreeSlotsOfOrgs("coalesce((SELECT max_parallelism FROM bump), 0)") + ` ELSE 0 END AS n
), sel AS (
  SELECT tid, id FROM cand WHERE (SELECT n FROM free) > 0 ORDER BY place LIMIT (SELECT n FROM free)
), locked AS (
  -- (by tuple id, as the near pick: no index lookup per started item)
  SELECT w.id, w.handler, w.ctid AS tid, w.org_id, w.run_at, w.pool, w.concurrency_key FROM workpool_work w
  WHERE w.ctid = ANY(ARRAY(SELECT tid FROM sel)) AND w.state = 'pending'
  FOR UPDATE SKIP LOCKED
), pick AS (
  -- each an item read ahead (only the loop writes a ready item's row, but
  -- a tuple's place is not its identity), in this pool, plain and due
  SELECT l.id, l.handler, l.tid, l.org_id, l.run_at FROM locked l
  WHERE l.id = ANY(ARRAY(SELECT id FROM sel)) AND l.pool = $1 AND l.concurrency_key IS NULL AND l.run_at <= $2
),
` + sqlStartPicked(`EXISTS (SELECT 1 FROM bump), coalesce((SELECT paused FROM bump), false), (SELECT ok FROM verdict),
  EXISTS (SELECT 1 FROM workpool_cancelations WHERE pool = $1), (SELECT n FROM free),
  coalesce((SELECT array_agg(id) FROM pick), '{}'), coalesce((SELECT array_agg(org_id) FROM pick), '{}'),
  (SELECT min(head_at) FROM workpool_org_queues WHERE pool = $1 AND head_at > $2),
  -- (for a recount only)
  (SELECT ok FROM rest), CASE WHEN NOT (SELECT ok FROM verdict) THEN (SELECT orgs FROM held) END,
  CASE WHEN NOT (SELECT ok FROM verdict) THEN (SELECT n FROM held) END,
  CASE WHEN NOT (SELECT ok FROM verdict) THEN pg_current_snapshot()::text END,`)

// queryer runs a query: the pool, or a test's transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readAheadFor reads ahead when plan p reads an org further than the
// view has read it: every org whose read-ahead runs low for the next few
// starts (widen: a plan of several starts' slots), so that the orgs that
// take turns, a burn-down draining them together, are read together. An
// org with less ready work than it asked for is exhausted: its
// read-ahead is all of it, and short says that p asked more of it than
// that (plan again). The read is bounded by timeout.
func (v *fairView) readAheadFor(ctx context.Context, q queryer, pool string, now time.Time, timeout time.Duration,
	p fairPlan, widen func() fairPlan) (short bool, err error) {
	need := false
	for i, org := range p.orgs {
		need = need || len(v.orgs[org].ahead) < int(p.n[i])
	}
	if !need {
		return false, nil
	}
	var (
		orgs  []string
		heads []time.Time
		ns    []int32
		want  = map[string]int32{}
	)
	for i, org := range p.orgs {
		want[org] = p.n[i]
	}
	// (worked out only when a read is due; p's orgs among its own, each
	// as far at least)
	wide := widen()
	for i, org := range wide.orgs {
		if o := v.orgs[org]; !o.exhausted && len(o.ahead) < int(wide.n[i]) {
			// (never less than p takes of it: fewer found is then all it has)
			n := max(readAheadOf(wide.n[i]), want[org])
			orgs, heads, ns = append(orgs, org), append(heads, o.head), append(ns, n)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout) // (only for a read: a start that reads nothing sets no timer)
	defer cancel()
	rows, err := q.Query(ctx, sqlReadAhead, pool, orgs, heads, ns, now)
	if err != nil {
		return false, fmt.Errorf("reading ahead pool %s's orgs: %w", pool, err)
	}
	var (
		org       string
		tids      []pgtype.TID
		ids       [][16]byte
		runAts    []time.Time
		exhausted bool
		next      *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&org, &tids, &ids, &runAts, &exhausted, &next}, func() error {
		o := v.orgs[org]
		o.ahead = make([]aheadItem, len(ids))
		for i := range ids {
			o.ahead[i] = aheadItem{tid: tids[i], id: ids[i], runAt: runAts[i]}
		}
		o.exhausted, o.next = exhausted, next
		if next != nil && (v.until.IsZero() || next.Before(v.until)) {
			// (its next item, once due, would be the plan's; the view
			// says nothing of it: it goes then)
			v.until = *next
		}
		if len(o.ahead) > 0 && o.ahead[0].runAt.After(o.head) {
			o.head, o.moved = o.ahead[0].runAt, true
		}
		short = short || len(o.ahead) < int(want[org])
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("reading ahead pool %s's orgs: %w", pool, err)
	}
	for _, org := range orgs {
		if o := v.orgs[org]; o.exhausted && len(o.ahead) == 0 {
			v.empty(org) // (short: planned again without it)
		}
	}
	return short, nil
}

// runPlanned runs a planned start from the loop's view and launches what
// it started; decided is false when the view no longer held (it then
// wrote nothing but the fence, and the view is dropped). A view that
// missed only the slots held — a completion committed but not yet handed
// over when the start took its snapshot — takes the slots held as that
// snapshot has them, and the start is planned again at once.
func (l *loop) runPlanned(ctx context.Context, now time.Time) (res iterResult, decided bool, err error) {
	for again := true; ; again = false {
		res, decided, recount, err := l.runPlannedOnce(ctx, now)
		if err != nil || decided || !recount || !again {
			if err == nil && !decided {
				l.dropView(ctx)
				l.planMisses++
				l.missedPlan()
				l.m.metrics.fairPlans.WithLabelValues(l.pool, "missed").Inc()
			}
			return res, decided, err
		}
		l.m.metrics.fairPlans.WithLabelValues(l.pool, "recounted").Inc()
	}
}

// runPlannedOnce is one planned start; recount says that the view missed
// only the slots held, and took them from the start's snapshot.
func (l *loop) runPlannedOnce(ctx context.Context, now time.Time) (res iterResult, decided, recount bool, err error) {
	v := l.view
	l.foldCompleted(v)
	p, err := v.readAhead(ctx, l.m.db, l.pool, now, &l.turns, l.m.cfg.StatementTimeout)
	if err != nil {
		// (a read: as a view that cannot be read, the near pick decides,
		// and the next view waits out the backoff)
		l.m.logger.Warn("reading ahead the pool's fair view failed; its fair starts go on the near pick for a while",
			"pool", l.pool, "error", err.Error())
		return iterResult{}, false, false, nil
	}
	// (With no slot free as the view has it, the start still runs: a
	// completion not yet handed over is recounted, and a kick for anything
	// else finds nothing to start, as the near pick would.)
	var r plannedRun
	args, sent := v.args(l, now, p)
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('synchronous_commit', 'off', true)") // (as runFast)
	b.Queue(sqlIterateFastPlanned, args...).QueryRow(func(row pgx.Row) error { return row.Scan(r.dest()...) })
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.m.cfg.StatementTimeout)
	defer cancel()
	l.m.exec.claiming.RLock() // until its claims are launched
	defer l.m.exec.claiming.RUnlock()
	if err := l.m.db.SendBatch(sctx, b).Close(); err != nil {
		l.m.exec.claimLost()
		l.view = nil
		return iterResult{}, false, false, fmt.Errorf("planned fast iteration: %w", err)
	}
	if !r.fenced {
		l.view = nil
		return iterResult{}, false, false, fmt.Errorf("pool %s at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	}
	l.gen++
	l.paused.Store(r.paused)
	if !r.ok {
		if !r.restOK {
			return iterResult{}, false, false, nil
		}
		if r.snap == nil {
			return iterResult{}, false, false, nil
		}
		taken, err := parseSnapshot(*r.snap)
		if err != nil {
			return iterResult{}, false, false, nil
		}
		v.snap, v.running = taken, make(map[string]int64, len(r.heldOrgs))
		for i, org := range r.heldOrgs {
			v.running[org] = r.heldN[i]
		}
		return iterResult{}, false, true, nil
	}
	l.m.metrics.fairPlans.WithLabelValues(l.pool, "held").Inc()
	l.turns.apply(p.charges(r.pickedOrgs))
	for _, org := range r.pickedOrgs {
		v.running[org]++
	}
	took := v.take(r.pickedIDs, r.pickedOrgs)
	l.launch(r.started)
	passedOver := sent < p.total() || !took || len(r.pickedIDs) < int(min(int64(r.free), int64(sent)))
	if passedOver {
		// A planned item did not start (a lock held it, or it changed),
		// or — not expected: readAhead plans again without an exhausted
		// org — an org had less ready work than planned: the view goes,
		// and the next waits out the backoff, as after a miss (a lock
		// held long would have every view dropped at once). (After the
		// launch: what started runs first.)
		l.dropView(ctx)
		l.planMisses++
		l.missedPlan()
	}
	didWork := len(r.started.lags) > 0
	if didWork && !passedOver {
		l.planMisses = 0 // (a plan that held but started nothing proves little)
	}
	if didWork {
		l.fastStarts++
		l.plannedStarts++
		l.lastActivity = now
	}
	res = iterResult{didWork: didWork, clean: !r.cancels, status: RunStatus{Kind: "running"},
		filled: didWork && len(r.started.lags) >= int(r.free), unseen: r.free > 0}
	if r.nextAt != nil {
		res.wakeAt = *r.nextAt
	}
	if !v.until.IsZero() && (res.wakeAt.IsZero() || v.until.Before(res.wakeAt)) {
		res.wakeAt = v.until
	}
	return res, true, false, nil
}

// readAhead plans the next start and reads ahead what it needs; when an
// org turns out to have less ready work than planned, it plans again
// without it (each time one org more is exhausted: it ends).
func (v *fairView) readAhead(ctx context.Context, q queryer, pool string, now time.Time, t *fairTurns, timeout time.Duration) (fairPlan, error) {
	for range len(v.orgs) + 1 { // (each pass but the last exhausts an org)
		p := v.plan(t)
		short, err := v.readAheadFor(ctx, q, pool, now, timeout, p, func() fairPlan { return v.planFree(t, 4*p.free) })
		if err != nil || !short {
			return p, err
		}
	}
	return fairPlan{}, errors.New("reading ahead: the plan kept asking for more than the orgs have")
}

// total is how many candidates the plan reads.
func (p fairPlan) total() int {
	n := 0
	for _, k := range p.n {
		n += int(k)
	}
	return n
}

// take takes the items a planned start started off their orgs'
// read-ahead, moving each org's head to its first item left (or to the
// last it started): ok is false when what started is not each org's
// first items read ahead (its head then stays at or before the first that
// did not start).
func (v *fairView) take(ids [][16]byte, orgs []string) (ok bool) {
	started := make(map[[16]byte]bool, len(ids))
	count := map[string]int{}
	for i, id := range ids {
		started[id] = true
		count[orgs[i]]++
	}
	ok = true
	for org, k := range count {
		o := v.orgs[org]
		if o == nil || k > len(o.ahead) {
			ok = false
			continue
		}
		if j := slices.IndexFunc(o.ahead[:k], func(it aheadItem) bool { return !started[it.id] }); j >= 0 {
			// One before the last started did not start (a lock held it,
			// or it changed): the head goes no further than it (the view
			// goes, and the picks read the org from its head).
			ok = false
			if at := o.ahead[j].runAt; at.After(o.head) {
				o.head, o.moved = at, true
			}
			continue
		}
		head := o.ahead[k-1].runAt
		if o.ahead = o.ahead[k:]; len(o.ahead) > 0 {
			head = o.ahead[0].runAt
		}
		if head.After(o.head) {
			o.head, o.moved = head, true
		}
		if o.exhausted && len(o.ahead) == 0 {
			v.empty(org)
		}
	}
	return ok
}

// empty takes an exhausted org whose ready work has all started off the
// view: like an org without ready work when the view was read, it is not
// planned, and the view goes when its next item comes due.
func (v *fairView) empty(org string) {
	o := v.orgs[org]
	delete(v.orgs, org)
	v.names = slices.DeleteFunc(slices.Clone(v.names), func(n string) bool { return n == org })
	if v.emptied == nil {
		v.emptied = map[string]*viewOrg{}
	}
	v.emptied[org] = o
	if o.next != nil && (v.until.IsZero() || o.next.Before(v.until)) {
		v.until = *o.next
	}
}

// expectedRunning is the slots held per org as the view has them: the
// orgs in byte order (as the statement's COLLATE "C") and their counts.
func (v *fairView) expectedRunning() ([]string, []int64) {
	orgs := make([]string, 0, len(v.running))
	for org, n := range v.running {
		if n > 0 {
			orgs = append(orgs, org)
		}
	}
	slices.Sort(orgs)
	counts := make([]int64, len(orgs))
	for i, org := range orgs {
		counts[i] = v.running[org]
	}
	return orgs, counts
}

// sqlMoveViewHeads moves the queue heads of pool $1 a view's reads went
// past ($2 orgs, $3 the heads, $4 the row versions the view read; a null
// head: the org has no pending plain work left, and its queue goes): only
// rows no one wrote since — an enqueue, retry or hand-back may have added
// work before the head — nor holds now (an enqueue not yet committed, a
// record holding a retry's row through its hooks: as the near pick's
// sqlMoveHeads, it does not wait for them). Found by tuple id.
const sqlMoveViewHeads = `
WITH untouched AS (
  SELECT q.tid, u.head FROM unnest($2::text[], $3::timestamptz[], $4::text[]) AS u(org_id, head, seen)
  CROSS JOIN LATERAL (
    SELECT q.ctid AS tid FROM workpool_org_queues q
    WHERE q.pool = $1 AND q.org_id = u.org_id AND q.xmin::text = u.seen AND (u.head IS NULL OR q.head_at < u.head)
    FOR UPDATE SKIP LOCKED) q
), raised AS (
  UPDATE workpool_org_queues q SET head_at = t.head FROM untouched t WHERE q.ctid = t.tid AND q.pool = $1 AND t.head IS NOT NULL
)
DELETE FROM workpool_org_queues q USING untouched t WHERE q.ctid = t.tid AND q.pool = $1 AND t.head IS NULL`

// dropView drops the loop's view, first moving the queue heads its
// reads went past: the near and full picks read each org from its head,
// and a burn-down's worth of started items before it is a long walk.
func (l *loop) dropView(ctx context.Context) {
	v := l.view
	l.view = nil
	if v == nil {
		return
	}
	var orgs, seen []string
	var heads []*time.Time
	for org, o := range v.orgs {
		if o.moved {
			orgs, heads, seen = append(orgs, org), append(heads, &o.head), append(seen, o.seen)
		}
	}
	for org, o := range v.emptied {
		orgs, heads, seen = append(orgs, org), append(heads, o.next), append(seen, o.seen)
	}
	if len(orgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.m.cfg.StatementTimeout)
	defer cancel()
	if _, err := l.m.db.Exec(ctx, sqlMoveViewHeads, l.pool, orgs, heads, seen); err != nil && ctx.Err() == nil {
		// (the heads stay behind: the picks read further, nothing more)
		l.m.logger.Warn("moving the org queues' heads past a fair view's starts failed", "pool", l.pool, "error", err.Error())
	}
}

// plannedRun is what sqlIterateFastPlanned returns: the fence, the pause,
// the verdict, whether cancelations wait, the free slots, the started
// items' ids and orgs, the next head to come due, the verdict but for the
// slots held (restOK), and, when the verdict failed, the slots held per
// org and the snapshot; then the starts.
type plannedRun struct {
	fenced, paused, ok, cancels, restOK bool
	free                                int32
	pickedIDs                           [][16]byte
	pickedOrgs, heldOrgs                []string
	nextAt                              *time.Time
	heldN                               []int64
	snap                                *string
	started                             startedWork
}

func (r *plannedRun) dest() []any {
	return append([]any{&r.fenced, &r.paused, &r.ok, &r.cancels, &r.free, &r.pickedIDs, &r.pickedOrgs,
		&r.nextAt, &r.restOK, &r.heldOrgs, &r.heldN, &r.snap}, r.started.dest()...)
}

// args are sqlIterateFastPlanned's parameters for plan p of the view:
// each planned org's first items read ahead, as many as the plan reads
// (sent: fewer when an org has fewer), in the fair order (sqlTurnOrder),
// worked out as Postgres would: the first two terms are float8 quotients
// of integers, and the last, the org id in its column's collation, is
// each org's place as the view read it. (Ordered here, the statement
// takes two arrays where it took six — the org, run_at and both terms of
// each item besides — whose encoding and decoding cost more than the
// ordering.)
func (v *fairView) args(l *loop, now time.Time, p fairPlan) (args []any, sent int) {
	type planned struct {
		key1, key2 float64
		place      int64
		it         aheadItem
	}
	all := make([]planned, 0, p.total())
	for i, org := range p.orgs {
		o := v.orgs[org]
		items := o.ahead[:min(len(o.ahead), int(p.n[i]))]
		for k, it := range items {
			c := cand{k: int64(k + 1), vrun: p.vrun[i], running: p.running[i], weight: p.weights[i]}
			all = append(all, planned{key1: c.key1(), key2: c.key2(), place: o.place, it: it})
		}
	}
	slices.SortFunc(all, func(a, b planned) int {
		return cmp.Or(cmp.Compare(a.key1, b.key1), cmp.Compare(a.key2, b.key2), a.it.runAt.Compare(b.it.runAt),
			cmp.Compare(a.place, b.place))
	})
	tids, ids := make([]pgtype.TID, len(all)), make([][16]byte, len(all)) // (ids as pgUUIDs)
	for i, c := range all {
		tids[i], ids[i] = c.it.tid, c.it.id
	}
	runOrgs, runN := v.expectedRunning()
	return append(l.startArgs(now), l.gen, tids, ids, runOrgs, runN, v.queues, v.version), len(ids)
}

// charges are what a planned start charged (sqlChargeTurns): each org
// that started k items, served + k, and the clock at the highest turn a
// start took.
func (p fairPlan) charges(pickedOrgs []string) turnCharges {
	var c turnCharges
	if len(pickedOrgs) == 0 {
		return c
	}
	k := map[string]int64{}
	for _, org := range pickedOrgs {
		k[org]++
	}
	var bestLast, bestWeight int64
	for i, org := range p.orgs {
		n := k[org]
		if n == 0 {
			continue
		}
		c.orgs = append(c.orgs, org)
		c.served = append(c.served, p.served[i]+n)
		c.weights = append(c.weights, int32(p.weights[i]))
		last := p.vrun[i] + n
		if bestWeight == 0 || float64(last)/float64(p.weights[i]) > float64(bestLast)/float64(bestWeight) {
			bestLast, bestWeight = last, p.weights[i]
		}
	}
	c.num, c.den = &bestLast, &bestWeight
	return c
}

// mayPlan says whether the loop may read a planned view now: this
// replica's executor alone runs the pool's work (another's completions
// would miss every plan), and no plan missed lately (planBackoff).
func (l *loop) mayPlan() bool {
	if l.planWait > 0 {
		l.planWait--
		return false
	}
	return l.m.exec.started.Load() && l.m.livePeers() == 0
}

// missedPlan starts a backoff after a planned start missed: 2, 4, …
// planBackoffMax fair starts on the near pick before the next view.
func (l *loop) missedPlan() {
	l.planWait = min(1<<min(l.planMisses, 8), planBackoffMax)
}
