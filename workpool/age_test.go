package workpool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The oldest pending item's age (GET /v1/pools/{pool} and the gauge) is
// its age however old its run_at: a time.Duration stopped at ~292 years.
func TestAgeSecondsIsTheAgeOfAnyRunAt(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 500_000_000, time.UTC)
	for name, tc := range map[string]struct {
		at   time.Time
		want float64
	}{
		"a second ago":           {now.Add(-time.Second), 1},
		"now":                    {now, 0},
		"in the future":          {now.Add(time.Hour), 0},
		"Go's zero time":         {time.Time{}, float64(now.Unix()-time.Time{}.Unix()) + 0.5},
		"year 0000":              {time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), float64(now.Unix()-time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix()) + 0.5},
		"a fraction of a second": {now.Add(-1500 * time.Millisecond), 1.5},
	} {
		t.Run(name, func(t *testing.T) {
			require.InDelta(t, tc.want, ageSeconds(now, tc.at), 1e-6)
		})
	}
}
