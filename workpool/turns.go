package workpool

import (
	"context"
	"fmt"
	"time"
)

// fairTurns is a pool's fair-share ledger (docs/workpool.md § "Fair
// share"): the starts charged to each org, at the weight it had then, and
// the pool's clock, the turn of its last fair start (num / den). Only the
// leading loop starts work, so only it charges turns: it keeps the ledger
// in memory, hands it to each fair pick as parameters, and applies what
// the pick charged once the pick has committed. Kept in the data, the
// ledger cost every fair start a read and four writes (docs/benchmarks.md
// § "Fair share"); now the loop saves it every turnsSaveEvery while it
// changes and when it stands down, and reads it when it takes the lead. A
// crash loses at most the last second's charges: a fairness blip, never
// work.
type fairTurns struct {
	orgs     map[string]orgTurns
	num, den int64
	dirty    bool      // charged since the last save
	savedAt  time.Time // the last save (or the read)
}

// orgTurns is one org's line of the ledger: the starts charged to it and
// the weight they were charged at. A pick treats a line whose weight is
// not the org's current one as absent: a weight change restarts the
// org's turns at the pool's current turn.
type orgTurns struct {
	served int64
	weight int32
}

// turnsSaveEvery is how often a leading loop saves a changed ledger.
const turnsSaveEvery = time.Second

// turnCharges is what a fair pick charged: the new totals of the orgs it
// started work of (each at the weight it ranked them by) and, when it
// started any, the pool's new clock.
type turnCharges struct {
	orgs     []string
	served   []int64
	weights  []int32
	num, den *int64
}

func (c *turnCharges) dest() []any {
	return []any{&c.orgs, &c.served, &c.weights, &c.num, &c.den}
}

// args are the ledger as a fair pick's parameters (turnParams): the orgs,
// their starts charged and weights, and the clock.
func (t *fairTurns) args() []any {
	orgs := make([]string, 0, len(t.orgs))
	served := make([]int64, 0, len(t.orgs))
	weights := make([]int32, 0, len(t.orgs))
	for org, o := range t.orgs {
		orgs = append(orgs, org)
		served = append(served, o.served)
		weights = append(weights, o.weight)
	}
	return []any{orgs, served, weights, t.num, max(t.den, 1)}
}

// apply enters a committed pick's charges (or a saved ledger as read:
// its clock stands even when every line was pruned).
func (t *fairTurns) apply(c turnCharges) {
	if c.num != nil && c.den != nil {
		t.num, t.den = *c.num, *c.den
		t.dirty = true
	}
	if len(c.orgs) == 0 {
		return
	}
	if t.orgs == nil {
		t.orgs = make(map[string]orgTurns, len(c.orgs))
	}
	for i, org := range c.orgs {
		t.orgs[org] = orgTurns{served: c.served[i], weight: c.weights[i]}
	}
	t.dirty = true
}

// prune drops the lines a pick would lift to the clock anyway (starts
// charged at or behind the current turn at their weight: sqlServed), so
// that the ledger the picks are handed holds only the orgs ahead of it.
func (t *fairTurns) prune() {
	den := max(t.den, 1)
	for org, o := range t.orgs {
		if o.served <= (t.num*int64(o.weight)+den-1)/den {
			delete(t.orgs, org)
		}
	}
}

// sqlReadTurns reads pool $1's saved ledger.
const sqlReadTurns = `
SELECT coalesce(array_agg(org_id ORDER BY org_id), '{}'), coalesce(array_agg(served ORDER BY org_id), '{}'),
  coalesce(array_agg(weight ORDER BY org_id), '{}'),
  (SELECT turn_num FROM workpool_fair_clocks WHERE pool = $1), (SELECT turn_den FROM workpool_fair_clocks WHERE pool = $1)
FROM workpool_org_turns WHERE pool = $1`

// sqlSaveTurns saves pool $1's ledger ($3 orgs, $4 served, $5 weights,
// $6 / $7 the clock), fenced by the generation ($2): a loop deposed since
// its last iteration writes nothing. The fence holds the pool row shared
// until the save commits, so that a takeover (which bumps the generation,
// then reads the ledger) waits for a save in flight and reads it, and a
// save after the takeover finds the generation moved. Lines no longer in
// the ledger go.
const sqlSaveTurns = `
WITH fence AS (
  SELECT 1 FROM workpool_pools WHERE name = $1 AND generation = $2 FOR SHARE
), kept AS (
  INSERT INTO workpool_org_turns (pool, org_id, served, weight)
  SELECT $1, t.org_id, t.served, t.weight FROM unnest($3::text[], $4::bigint[], $5::int[]) AS t(org_id, served, weight)
  WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (pool, org_id) DO UPDATE SET served = excluded.served, weight = excluded.weight
), gone AS (
  -- (an anti-join: as org_id <> ALL($3), the generic plan a connection
  -- reuses compared every line with every org of the ledger)
  DELETE FROM workpool_org_turns o WHERE o.pool = $1 AND EXISTS (SELECT 1 FROM fence)
    AND NOT EXISTS (SELECT 1 FROM unnest($3::text[]) AS k(org_id) WHERE k.org_id = o.org_id)
), clock AS (
  INSERT INTO workpool_fair_clocks (pool, turn_num, turn_den)
  SELECT $1, $6, $7 WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (pool) DO UPDATE SET turn_num = excluded.turn_num, turn_den = excluded.turn_den
)
SELECT EXISTS (SELECT 1 FROM fence)`

// readTurns reads the pool's saved ledger into the loop (on taking the
// lead).
func (l *loop) readTurns(ctx context.Context) error {
	var c turnCharges
	if err := l.m.db.QueryRow(ctx, sqlReadTurns, l.pool).Scan(c.dest()...); err != nil {
		return fmt.Errorf("reading pool %s's fair-share turns: %w", l.pool, err)
	}
	l.turns = fairTurns{savedAt: l.m.now()}
	l.turns.apply(c)
	l.turns.dirty = false
	return nil
}

// saveTurns saves the loop's ledger when it changed since the last save
// and (unless now is zero: the term's end) turnsSaveEvery has passed.
func (l *loop) saveTurns(ctx context.Context, now time.Time) error {
	if !l.turns.dirty || (!now.IsZero() && now.Sub(l.turns.savedAt) < turnsSaveEvery) {
		return nil
	}
	l.turns.prune()
	a := l.turns.args()
	ctx, cancel := context.WithTimeout(ctx, l.m.cfg.StatementTimeout) // (see Config.StatementTimeout)
	defer cancel()
	var fenced bool
	if err := l.m.db.QueryRow(ctx, sqlSaveTurns, append([]any{l.pool, l.gen}, a...)...).Scan(&fenced); err != nil {
		return fmt.Errorf("saving pool %s's fair-share turns: %w", l.pool, err)
	}
	if !fenced {
		return fmt.Errorf("saving pool %s's fair-share turns at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	}
	l.turns.dirty, l.turns.savedAt = false, l.m.now()
	return nil
}

// turnParams numbers a fair pick's parameters for the loop's turns
// (fairTurns.args), from the first: the orgs, the starts charged to each,
// the weight each was charged at, and the pool's clock (num, den).
type turnParams int

func (p turnParams) param(i int, typ string) string {
	return fmt.Sprintf("$%d::%s", int(p)+i, typ)
}

// lines is the loop's turns as rows (org_id, served, weight).
func (p turnParams) lines() string {
	return `SELECT * FROM unnest(` + p.param(0, "text[]") + `, ` + p.param(1, "bigint[]") + `, ` + p.param(2, "int[]") +
		`) AS t(org_id, served, weight)`
}
