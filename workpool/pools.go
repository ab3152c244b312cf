package workpool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
)

// ensurePools creates the configured pools that do not exist yet; existing
// pools keep their settings, so replicas never fight over them.
func (m *Manager) ensurePools(ctx context.Context) error {
	names := sortedPools(m.cfg.Pools)
	if len(names) == 0 {
		return nil
	}
	limits := make([]int32, len(names))
	for i, n := range names {
		limits[i] = int32(m.cfg.Pools[n])
	}
	if _, err := m.db.Exec(ctx, sqlEnsurePools, names, limits); err != nil {
		return fmt.Errorf("creating pools: %w", err)
	}
	return nil
}

func (m *Manager) poolNames(ctx context.Context) ([]string, error) {
	rows, err := m.db.Query(ctx, sqlListPoolNames)
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	return names, nil
}

// Pools describes every pool, with orgID's counts in each.
func (m *Manager) Pools(ctx context.Context, orgID string) ([]PoolInfo, error) {
	names, err := m.poolNames(ctx)
	if err != nil {
		return nil, err
	}
	return m.poolInfos(ctx, orgID, names)
}

// Pool describes one pool with orgID's counts; ErrPoolNotFound if absent.
func (m *Manager) Pool(ctx context.Context, orgID, name string) (PoolInfo, error) {
	infos, err := m.poolInfos(ctx, orgID, []string{name})
	if err != nil {
		return PoolInfo{}, err
	}
	if len(infos) == 0 {
		return PoolInfo{}, ErrPoolNotFound
	}
	return infos[0], nil
}

func (m *Manager) poolInfos(ctx context.Context, orgID string, names []string) ([]PoolInfo, error) {
	now := m.now()
	rows, err := m.db.Query(ctx, sqlPoolInfo, names, orgID, now)
	if err != nil {
		return nil, fmt.Errorf("reading pools: %w", err)
	}
	defer rows.Close()
	var out []PoolInfo
	for rows.Next() {
		var (
			p                      PoolInfo
			perOrg                 *int32
			maxPar, weight         int32
			oldest, nextAt         *time.Time
			readyPlain, keyedReady int64
		)
		err := rows.Scan(&p.Name, &maxPar, &perOrg, &p.Paused, &p.LoopStatus.Kind, &p.LoopStatus.Saturated, &p.LoopStatus.At,
			&p.Running, &p.Pending, &oldest, &readyPlain, &keyedReady, &p.BlockedByKey, &nextAt, &weight,
			&p.Report.Succeeded, &p.Report.Failed, &p.Report.Canceled, &p.Report.Retries)
		if err != nil {
			return nil, fmt.Errorf("reading pools: %w", err)
		}
		p.MaxParallelism, p.Weight = int(maxPar), int(weight)
		if perOrg != nil {
			v := int(*perOrg)
			p.MaxParallelismPerOrg = &v
			// What the cap leaves room for starts; the rest of what its keys
			// let through waits for the org's running work to finish.
			p.BlockedByOrgCap = max(readyPlain+keyedReady-max(int64(v)-p.Running, 0), 0)
		}
		if oldest != nil {
			p.OldestPendingAgeSeconds = ageSeconds(now, *oldest)
		}
		p.Report.Completed = p.Report.Succeeded + p.Report.Failed + p.Report.Canceled
		if p.LoopStatus.Kind != "scheduled" {
			p.LoopStatus.At = nil
		}
		p.RunStatus = orgRunStatus(p, readyPlain+keyedReady-p.BlockedByOrgCap, nextAt)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pools: %w", err)
	}
	return out, nil
}

// orgRunStatus is the run status the pool's loop would publish were the
// org's work (startable of it ready to start now, its next future run_at
// nextAt) all there is: what the loop publishes comes of every org's work,
// and another org's is absent data — its timed wake-ups, or its running
// work filling the pool, are not for this org to see. Without the loop's
// short cooldown.
func orgRunStatus(p PoolInfo, startable int64, nextAt *time.Time) RunStatus {
	limit := int64(p.MaxParallelism)
	if p.MaxParallelismPerOrg != nil {
		limit = min(limit, int64(*p.MaxParallelismPerOrg))
	}
	switch {
	case p.Paused && p.Running+p.Pending > 0:
		return RunStatus{Kind: "scheduled", At: nextAt}
	case p.Paused:
		return RunStatus{Kind: "idle"}
	case startable > 0 && p.Running < limit:
		return RunStatus{Kind: "running"}
	case p.Running+p.Pending > 0:
		return RunStatus{Kind: "scheduled", Saturated: p.Running >= limit, At: nextAt}
	}
	return RunStatus{Kind: "idle"}
}

// MaxOrgWeight bounds an org's fair-share weight.
const MaxOrgWeight = 100

// maxOrgWeightsPerUpdate bounds the weights one update sets.
const maxOrgWeightsPerUpdate = 1000

// maxOrgIDBytes bounds an org id named in a pool's settings (tokens carry
// shorter ones; this keeps a PATCH from storing arbitrary text).
const maxOrgIDBytes = 255

// PoolUpdate is a change to some of a pool's settings; fields left unset
// keep their values.
type PoolUpdate struct {
	// MaxParallelism, when set, is the pool's new limit (1–10,000). Every
	// replica's loop reads it on its next iteration. Lowering it never stops
	// running work: the loop starts nothing until the running count is
	// under the new limit.
	MaxParallelism *int
	// SetMaxParallelismPerOrg says that MaxParallelismPerOrg replaces the
	// cap on the slots one org may hold (nil removes the cap).
	SetMaxParallelismPerOrg bool
	MaxParallelismPerOrg    *int
	// Paused, when set, pauses (true) or resumes (false) the pool.
	Paused *bool
	// ClearOrgWeights gives every org the default weight (1) before
	// OrgWeights applies.
	ClearOrgWeights bool
	// OrgWeights sets orgs' fair-share weights (1–MaxOrgWeight); a nil
	// weight gives the org the default weight.
	OrgWeights map[string]*int
}

// UpdatePool applies u whole or not at all: every field is validated first
// (an *apperr.InvalidError names each bad one: "org_weights.<org>" for a
// weight), then all are written in one transaction, and the pool's leader
// is woken so that a raised limit or a resume starts waiting work at once.
// ErrPoolNotFound if the pool does not exist.
func (m *Manager) UpdatePool(ctx context.Context, pool string, u PoolUpdate) error {
	inv := &apperr.InvalidError{}
	var maxPar, perOrg *int32
	if u.MaxParallelism != nil {
		if n := *u.MaxParallelism; n < 1 || n > MaxParallelismLimit {
			inv.Add("max_parallelism", fmt.Sprintf("must be between 1 and %d", MaxParallelismLimit))
		} else {
			maxPar = ptr(int32(n))
		}
	}
	if u.SetMaxParallelismPerOrg && u.MaxParallelismPerOrg != nil {
		if n := *u.MaxParallelismPerOrg; n < 1 || n > MaxParallelismLimit {
			inv.Add("max_parallelism_per_org", fmt.Sprintf("must be between 1 and %d, or null for no cap", MaxParallelismLimit))
		} else {
			perOrg = ptr(int32(n))
		}
	}
	weights := checkOrgWeights(inv, u.OrgWeights)
	if err := inv.OrNil(); err != nil {
		return err
	}
	// (a scrape of this replica after the change shows it, paused or not)
	defer m.metrics.depth.forget()
	return pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		// The pool row first: it tells an unknown pool, and its lock orders
		// this change after any iteration in flight.
		tag, err := tx.Exec(ctx, sqlUpdatePool, pool, maxPar, u.SetMaxParallelismPerOrg, perOrg, u.Paused)
		if err != nil {
			return fmt.Errorf("updating pool %s: %w", pool, err)
		}
		if tag.RowsAffected() == 0 {
			return ErrPoolNotFound
		}
		if err := weights.write(ctx, tx, pool, u.ClearOrgWeights); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlNotify, "k:"+pool); err != nil {
			return fmt.Errorf("waking pool %s: %w", pool, err)
		}
		return nil
	})
}

// orgWeights is a validated weight change: orgs given a weight other than
// the default, and orgs given the default (whose override goes).
type orgWeights struct {
	setOrgs   []string
	setValues []int32
	unset     []string
}

// checkOrgWeights validates ws, naming each bad entry "org_weights.<org>",
// in org order.
func checkOrgWeights(inv *apperr.InvalidError, ws map[string]*int) orgWeights {
	var out orgWeights
	if len(ws) > maxOrgWeightsPerUpdate {
		inv.Add("org_weights", fmt.Sprintf("may set at most %d orgs' weights at once", maxOrgWeightsPerUpdate))
		return out
	}
	orgs := make([]string, 0, len(ws))
	for org := range ws {
		orgs = append(orgs, org)
	}
	sort.Strings(orgs)
	for _, org := range orgs {
		field, w := "org_weights."+org, ws[org]
		switch {
		case strings.TrimSpace(org) == "" || len(org) > maxOrgIDBytes || !utf8.ValidString(org) || strings.ContainsRune(org, 0):
			inv.Add(field, fmt.Sprintf("names no org: an org id is 1 to %d bytes of UTF-8 without control characters, not blank", maxOrgIDBytes))
		case w == nil || *w == 1:
			// (an org id with a control character may be removed: a weight
			// set before such ids were refused is shown, and must go)
			out.unset = append(out.unset, org)
		case strings.ContainsFunc(org, unicode.IsControl):
			// (as a token's org_id claim: one with a control character is
			// refused, so such a weight could never apply)
			inv.Add(field, fmt.Sprintf("names no org: an org id is 1 to %d bytes of UTF-8 without control characters, not blank", maxOrgIDBytes))
		case *w < 1 || *w > MaxOrgWeight:
			inv.Add(field, fmt.Sprintf("must be between 1 and %d, or null for the default (1)", MaxOrgWeight))
		default:
			out.setOrgs, out.setValues = append(out.setOrgs, org), append(out.setValues, int32(*w))
		}
	}
	return out
}

func (w orgWeights) write(ctx context.Context, tx pgx.Tx, pool string, clearAll bool) error {
	if clearAll {
		if _, err := tx.Exec(ctx, sqlClearOrgWeights, pool); err != nil {
			return fmt.Errorf("clearing weights in %s: %w", pool, err)
		}
	}
	if len(w.unset) > 0 && !clearAll {
		if _, err := tx.Exec(ctx, sqlDeleteOrgWeights, pool, w.unset); err != nil {
			return fmt.Errorf("removing weights in %s: %w", pool, err)
		}
	}
	if len(w.setOrgs) > 0 {
		if _, err := tx.Exec(ctx, sqlSetOrgWeights, pool, w.setOrgs, w.setValues); err != nil {
			return fmt.Errorf("setting weights in %s: %w", pool, err)
		}
	}
	return nil
}

// SetMaxParallelism changes a pool's limit live (UpdatePool).
func (m *Manager) SetMaxParallelism(ctx context.Context, pool string, n int) error {
	return m.UpdatePool(ctx, pool, PoolUpdate{MaxParallelism: &n})
}

// SetMaxParallelismPerOrg caps how many slots one org may hold in a pool
// (nil removes the cap; UpdatePool).
func (m *Manager) SetMaxParallelismPerOrg(ctx context.Context, pool string, n *int) error {
	return m.UpdatePool(ctx, pool, PoolUpdate{SetMaxParallelismPerOrg: true, MaxParallelismPerOrg: n})
}

// SetOrgWeight gives orgID weight w (1–100) in pool's fair share; w = 1
// (the default) removes the override (UpdatePool).
func (m *Manager) SetOrgWeight(ctx context.Context, pool, orgID string, w int) error {
	return m.UpdatePool(ctx, pool, PoolUpdate{OrgWeights: map[string]*int{orgID: &w}})
}

// Pause makes pool start nothing until Resume: it still accepts work;
// running work finishes, cancelations and hooks proceed. No start commits
// after Pause returns (the loop reads the flag from the pool row it locks
// for every iteration). Pausing a paused pool changes nothing.
// ErrPoolNotFound if the pool does not exist.
func (m *Manager) Pause(ctx context.Context, pool string) error {
	return m.UpdatePool(ctx, pool, PoolUpdate{Paused: ptr(true)})
}

// Resume undoes Pause; the pool's loop is woken and starts ready work at
// once.
func (m *Manager) Resume(ctx context.Context, pool string) error {
	return m.UpdatePool(ctx, pool, PoolUpdate{Paused: ptr(false)})
}

// OrgWeights lists pool's fair-share weights other than the default, by
// org: an operator's view, across orgs.
func (m *Manager) OrgWeights(ctx context.Context, pool string) (map[string]int, error) {
	rows, err := m.db.Query(ctx, sqlOrgWeights, pool)
	if err != nil {
		return nil, fmt.Errorf("reading weights in %s: %w", pool, err)
	}
	out := map[string]int{}
	var (
		org string
		w   int32
	)
	_, err = pgx.ForEachRow(rows, []any{&org, &w}, func() error { out[org] = int(w); return nil })
	if err != nil {
		return nil, fmt.Errorf("reading weights in %s: %w", pool, err)
	}
	return out, nil
}

// IsNotFound reports whether err means absent work or pool.
func IsNotFound(err error) bool { return errors.Is(err, apperr.ErrNotFound) }
