package workpool

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/apperr"
)

// Check validates an item as Enqueue would, pool existence included,
// without writing anything; fields are named with fieldPrefix ("work.").
// Callers that must decide something before they enqueue — the wake-up gate
// spends money first — use it to refuse bad input before acting.
func (m *Manager) Check(ctx context.Context, q Querier, p EnqueueParams, fieldPrefix string) error {
	inv := &apperr.InvalidError{}
	m.validate(inv, fieldPrefix, p)
	if err := inv.OrNil(); err != nil {
		return err
	}
	rows, err := q.Query(ctx, sqlKnownPools, []string{p.Pool})
	if err != nil {
		return fmt.Errorf("checking pools: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("checking pools: %w", err)
	}
	if !slices.Contains(known, p.Pool) {
		return apperr.Invalid(fieldPrefix+"pool", fmt.Sprintf("unknown pool %q", p.Pool))
	}
	return nil
}
