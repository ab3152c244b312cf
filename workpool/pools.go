package workpool

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	rows, err := m.db.Query(ctx, sqlPoolInfo, names, orgID)
	if err != nil {
		return nil, fmt.Errorf("reading pools: %w", err)
	}
	defer rows.Close()
	now := m.now()
	var out []PoolInfo
	for rows.Next() {
		var (
			p      PoolInfo
			perOrg *int32
			maxPar int32
			oldest *time.Time
		)
		err := rows.Scan(&p.Name, &maxPar, &perOrg, &p.RunStatus.Kind, &p.RunStatus.Saturated, &p.RunStatus.At,
			&p.Running, &p.Pending, &oldest, &p.Report.Succeeded, &p.Report.Failed, &p.Report.Canceled, &p.Report.Retries)
		if err != nil {
			return nil, fmt.Errorf("reading pools: %w", err)
		}
		p.MaxParallelism = int(maxPar)
		if perOrg != nil {
			v := int(*perOrg)
			p.MaxParallelismPerOrg = &v
		}
		if oldest != nil && oldest.Before(now) {
			p.OldestPendingAge = now.Sub(*oldest)
		}
		p.Report.Completed = p.Report.Succeeded + p.Report.Failed + p.Report.Canceled
		if p.RunStatus.Kind != "scheduled" {
			p.RunStatus.At = nil
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pools: %w", err)
	}
	return out, nil
}

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
}

// UpdatePool applies u whole or not at all: every field is validated first
// (an *apperr.InvalidError names each bad one), then all are written by one
// statement, and the pool's leader is woken so that a raised limit starts
// waiting work at once. ErrPoolNotFound if the pool does not exist.
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
	if err := inv.OrNil(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlUpdatePool, pool, maxPar, u.SetMaxParallelismPerOrg, perOrg)
		if err != nil {
			return fmt.Errorf("updating pool %s: %w", pool, err)
		}
		if tag.RowsAffected() == 0 {
			return ErrPoolNotFound
		}
		if _, err := tx.Exec(ctx, sqlNotify, "k:"+pool); err != nil {
			return fmt.Errorf("waking pool %s: %w", pool, err)
		}
		return nil
	})
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
// (the default) removes the override.
func (m *Manager) SetOrgWeight(ctx context.Context, pool, orgID string, w int) error {
	if w < 1 || w > 100 {
		return apperr.Invalid("weight", "must be between 1 and 100")
	}
	var err error
	if w == 1 {
		_, err = m.db.Exec(ctx, sqlDeleteOrgWeight, pool, orgID)
	} else {
		_, err = m.db.Exec(ctx, sqlSetOrgWeight, pool, orgID, int32(w))
	}
	if err != nil {
		return fmt.Errorf("setting weight of %s in %s: %w", orgID, pool, err)
	}
	return nil
}

// IsNotFound reports whether err means absent work or pool.
func IsNotFound(err error) bool { return errors.Is(err, apperr.ErrNotFound) }
