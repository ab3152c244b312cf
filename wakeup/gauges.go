package wakeup

import (
	"context"
	"fmt"

	"github.com/reveille/reveille/internal/db"
)

// OpenStates are the states of a wake-up not yet resolved, in the order of
// its life: after them it is resolved, and its signal is the outbox's.
var OpenStates = []string{stateAwaitingApproval, stateFunded, stateEnqueued}

// qCountOpen counts the unresolved wake-ups by state over the open rows
// only (wakeups_open). Spans every org: it feeds the process's gauges.
const qCountOpen = `SELECT state, count(*) FROM wakeups WHERE state <> 'resolved' GROUP BY state`

// CountOpen counts the wake-ups not yet resolved, by state (every one of
// OpenStates is present).
func CountOpen(ctx context.Context, q db.Querier) (map[string]int64, error) {
	rows, err := q.Query(ctx, qCountOpen)
	if err != nil {
		return nil, fmt.Errorf("count open wake-ups: %w", err)
	}
	defer rows.Close()
	counts := make(map[string]int64, len(OpenStates))
	for _, s := range OpenStates {
		counts[s] = 0
	}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return nil, fmt.Errorf("count open wake-ups: %w", err)
		}
		counts[state] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count open wake-ups: %w", err)
	}
	return counts, nil
}
