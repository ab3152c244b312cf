package approvals

import (
	"context"
	"fmt"

	"github.com/reveille/reveille/internal/db"
)

// CountPending counts the tool calls pending now, across every org
// (qCountPending, through the partial index tool_approvals_expiry).
func CountPending(ctx context.Context, q db.Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, qCountPending).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending tool calls: %w", err)
	}
	return n, nil
}
