package mandates

import (
	"context"
	"fmt"

	"github.com/reveille/reveille/internal/db"
)

// qCountPendingApprovals counts pending approval requests through the
// partial index mandate_approvals_expiry. Spans every org: it feeds the
// process's gauges.
const qCountPendingApprovals = `SELECT count(*) FROM mandate_approvals WHERE state = 'pending'`

// CountPendingApprovals counts the spending approval requests pending now.
func CountPendingApprovals(ctx context.Context, q db.Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, qCountPendingApprovals).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending approval requests: %w", err)
	}
	return n, nil
}
