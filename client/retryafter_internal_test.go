package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Clients refused together by one Retry-After do not come back in the same
// instant: each waits the Retry-After and a random part of up to a quarter
// of it more, at most a second — never past the context's deadline, or a
// live reader's MaxOutage, when the Retry-After itself ends before it.
func TestARetryAfterIsWaitedWithASpreadThatNeverPassesTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration
		deadline   time.Duration // 0: none
		limit      time.Duration // 0: none
		most       time.Duration
	}{
		{"a second: up to a quarter more", time.Second, 0, 0, time.Second + 250*time.Millisecond},
		{"a minute: at most a second more", time.Minute, 0, 0, time.Minute + time.Second},
		{"a deadline close after it: none past the deadline", time.Second, 1100 * time.Millisecond, 0, 1100 * time.Millisecond},
		{"a deadline before its end: the Retry-After alone", time.Second, 500 * time.Millisecond, 0, time.Second},
		{"a limit close after it (a live reader's MaxOutage): none past it", time.Second, 0, 1100 * time.Millisecond, 1100 * time.Millisecond},
		{"a limit before its end: the Retry-After alone", time.Second, 0, 500 * time.Millisecond, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			var until time.Time
			if tc.limit > 0 {
				until = time.Now().Add(tc.limit)
			}
			waits := map[time.Duration]bool{}
			for range 200 {
				d := pastRetryAfter(ctx, tc.retryAfter, until)
				require.GreaterOrEqual(t, d, tc.retryAfter)
				require.LessOrEqual(t, d, tc.most)
				waits[d] = true
			}
			if tc.most > tc.retryAfter+50*time.Millisecond {
				require.Greater(t, len(waits), 100, "spread: %d distinct waits of 200", len(waits))
			} else if (tc.deadline > 0 && tc.deadline < tc.retryAfter) || (tc.limit > 0 && tc.limit < tc.retryAfter) {
				require.Len(t, waits, 1)
			}
		})
	}
}
