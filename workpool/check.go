package workpool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
)

// Check validates an item as Enqueue would, pool existence included,
// without writing anything; fields are named with fieldPrefix ("work.").
// Callers that must decide something before they enqueue — the wake-up gate
// spends money first — use it to refuse bad input before acting. Handlers
// are this replica's; pools come from knownPools, so a check of a pool
// seen within knownPoolTTL costs no query.
func (m *Manager) Check(ctx context.Context, q Querier, p EnqueueParams, fieldPrefix string) error {
	inv := &apperr.InvalidError{}
	m.validate(inv, fieldPrefix, p)
	if err := inv.OrNil(); err != nil {
		return err
	}
	ok, err := m.poolExists(ctx, q, p.Pool)
	if err != nil {
		return err
	}
	if !ok {
		return apperr.Invalid(fieldPrefix+"pool", fmt.Sprintf("unknown pool %q", p.Pool))
	}
	return nil
}

// knownPoolTTL is how long a pool found to exist is trusted without a
// query. The engine never drops a pool (an operator may, by hand): one
// dropped is refused again by Check within this time, and meanwhile the
// enqueue itself refuses its items (a wake-up's intent then stays funded
// until the reconciler refunds it, as when the pool goes between a check
// and an enqueue).
const knownPoolTTL = time.Minute

// knownPools caches which pools exist, for Check. Pools are created from
// each replica's configuration, so another replica may have made one this
// one has never seen: a name it does not know is looked up at once
// (refresh on miss), and only names found are kept, so its size is the
// number of pools whatever callers send.
type knownPools struct {
	mu   sync.Mutex
	seen map[string]time.Time // pool → when it was last found to exist
}

func (k *knownPools) fresh(pool string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.seen[pool]
	return ok && now.Sub(at) < knownPoolTTL
}

// found records whether pool exists as of now.
func (k *knownPools) found(pool string, exists bool, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !exists {
		delete(k.seen, pool)
		return
	}
	if k.seen == nil {
		k.seen = map[string]time.Time{}
	}
	k.seen[pool] = now
}

// poolExists reports whether pool exists, asking q only when knownPools
// has no fresh answer.
func (m *Manager) poolExists(ctx context.Context, q Querier, pool string) (bool, error) {
	now := m.now()
	if m.knownPools.fresh(pool, now) {
		return true, nil
	}
	rows, err := q.Query(ctx, sqlKnownPools, []string{pool})
	if err != nil {
		return false, fmt.Errorf("checking pools: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, fmt.Errorf("checking pools: %w", err)
	}
	exists := len(known) > 0
	m.knownPools.found(pool, exists, now)
	return exists, nil
}
