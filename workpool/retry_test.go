package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/testkit"
)

// A policy at the validation's limits, on work that fails at once, used to
// overflow base^(attempt−1) at attempt 156: the iteration scheduling its
// retry failed, the leader stood down and met the same batch again, and no
// org's work in the pool started or finished any more.
func TestRetry_APoisonPolicyAtTheLimitsRunsOutItsAttemptsWhileAnotherOrgsWorkKeepsFinishing(t *testing.T) {
	t.Parallel()
	_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 2}})
	m.Register("fails_fast", func(context.Context, Job) (json.RawMessage, error) { return nil, errors.New("poison") })
	ctx := context.Background()

	poison := enqueueOn(t, m, EnqueueParams{OrgID: "org-poison", Handler: "fails_fast",
		Retry: &RetryPolicy{MaxAttempts: maxRetryAttempts, InitialBackoffMS: 0, Base: maxRetryBase}})

	// Each round needs the other org's fresh work to finish; the poison item
	// goes through all its attempts meanwhile (0 backoff: a few ms each).
	for round := 0; ; round++ {
		other := enqueueOn(t, m, EnqueueParams{OrgID: "org-other", Handler: "noop"})
		requireFinished(t, m, "org-other", other, OutcomeSucceeded)
		st, err := m.Status(ctx, "org-poison", poison)
		require.NoError(t, err)
		if st.State == StateFinished {
			break
		}
		require.Less(t, round, 5000, "the poison item is stuck at attempt %d", st.PreviousAttempts)
	}
	s := requireFinished(t, m, "org-poison", poison, OutcomeFailed)
	require.Equal(t, maxRetryAttempts, s.Attempts)
	require.Equal(t, "poison", s.Error)
}

// Retries past the old overflow point are scheduled within MaxRetryDelay
// for every policy at the limits; the attempt counter is set directly to
// get there without days of backoff.
func TestRetry_TheDelayAtTheLimitsIsScheduledAndNeverExceeds24h(t *testing.T) {
	t.Parallel()
	day := MaxRetryDelay
	for _, tc := range []struct {
		name           string
		initialMS      int
		base           float64
		attemptsBefore int // attempts already made when the failing one starts
		lo, hi         time.Duration
	}{
		{"zero backoff, max base, past the old overflow", 0, maxRetryBase, 160, 0, 0},
		{"zero backoff, max base, last retry", 0, maxRetryBase, maxRetryAttempts - 2, 0, 0},
		{"max backoff, max base, past the old overflow", maxRetryBackoffMS, maxRetryBase, 160, day, day},
		{"max backoff, base 1, late retry", maxRetryBackoffMS, 1, 500, day / 2, day},
		{"1 ms, max base, last retry", 1, maxRetryBase, maxRetryAttempts - 2, day, day},
		{"1 ms, base 1, last retry", 1, 1, maxRetryAttempts - 2, time.Millisecond / 2, 3 * time.Millisecond / 2},
		{"1 ms, base 1.02, last retry", 1, 1.02, maxRetryAttempts - 2, day, day},
		{"1 ms, base 1.02, 900 attempts: below the cap, exact", 1, 1.02, 900,
			time.Duration(0.5 * math.Pow(1.02, 900) * float64(time.Millisecond)),
			time.Duration(1.5 * math.Pow(1.02, 900) * float64(time.Millisecond))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			id := h.enqueue(withRetry(maxRetryAttempts, tc.initialMS, tc.base))
			h.exec(`UPDATE workpool_work SET attempts = $2 WHERE id = $1`, id, tc.attemptsBefore)
			h.runMain()
			h.complete(id, "failed", tc.attemptsBefore+1)

			h.runMain()

			var runAt time.Time
			var state string
			require.NoError(t, h.db.QueryRow(h.ctx, `SELECT state, run_at FROM workpool_work WHERE id = $1`, id).Scan(&state, &runAt))
			// (with no delay the same iteration starts the retry at once)
			require.Contains(t, []string{"pending", "running"}, state, "the retry is scheduled")
			delay := runAt.Sub(h.clock.Now())
			// run_at has microsecond precision.
			require.GreaterOrEqual(t, delay, tc.lo-time.Microsecond)
			require.LessOrEqual(t, delay, tc.hi+time.Microsecond)
		})
	}
}

// Retry jitter is real: items of one policy that fail in the same
// iteration are scheduled apart (a herd retried at one instant stays a
// herd), each within [0.5, 1.5) of the policy's delay, and spread over
// that whole range: some fall in its lowest quarter, some in its highest
// (a factor narrowed to ±25 % would put none there; with 64 items a
// correct factor misses one of them with odds of about 2·0.75^64 ≈ 10^-8).
func TestRetry_ItemsFailingTogetherAreRetriedAtDifferentTimes(t *testing.T) {
	t.Parallel()
	const n = 64
	h := newHarness(t, withMaxParallelism(n)) // all of them start in one iteration, and fail together
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = h.enqueue(withRetry(3, 60_000, 2))
	}
	h.runMain()
	for _, id := range ids {
		h.complete(id, "failed", 1)
	}

	h.runMain()

	seen := map[time.Time]bool{}
	lowest, highest := 90*time.Second, time.Duration(0)
	for _, id := range ids {
		var runAt time.Time
		require.NoError(t, h.db.QueryRow(h.ctx, `SELECT run_at FROM workpool_work WHERE id = $1 AND state = 'pending'`, id).Scan(&runAt))
		delay := runAt.Sub(h.clock.Now())
		require.GreaterOrEqual(t, delay, 30*time.Second-time.Microsecond)
		require.Less(t, delay, 90*time.Second+time.Microsecond)
		seen[runAt] = true
		lowest, highest = min(lowest, delay), max(highest, delay)
	}
	require.Greater(t, len(seen), n/2, "jitter spreads the retries of one policy")
	require.Less(t, lowest, 45*time.Second, "some retries come in the lowest quarter of [0.5, 1.5) × 60 s")
	require.Greater(t, highest, 75*time.Second, "and some in the highest")
}

// The Go spellings of the bounds agree with the SQL ones, and the exponent
// cap never shortens a delay that would reach the cap.
func TestRetry_TheDelayBoundsAgree(t *testing.T) {
	t.Parallel()
	require.Equal(t, strconv.FormatInt(MaxRetryDelay.Milliseconds(), 10), maxRetryDelayMS)
	exp, err := strconv.ParseFloat(retryExponentCap, 64)
	require.NoError(t, err)
	require.Greater(t, math.Exp(exp)*0.5, float64(MaxRetryDelay.Milliseconds()), "1 ms scaled by e^cap reaches the cap at the lowest jitter")
	require.False(t, math.IsInf(float64(maxRetryBackoffMS)*math.Exp(exp)*1.5, 0))
}

// sqlRetryDelayMS and sqlRetryRunAt ($3: now) are retryDelayMS — the one
// spelling sqlComplete uses, with n = w.attempts + 1 — and the run_at it
// gives, for a row whose w.attempts attempts have finished.
var (
	sqlRetryDelayMS = retryDelayMS("w.attempts")
	sqlRetryRunAt   = `$3::timestamptz + make_interval(secs => ` + sqlRetryDelayMS + ` / 1000.0)`
)

// FuzzRetryDelay feeds any retry policy through the validation and, if it
// passes, any attempt count through the delay the loop computes (the SQL
// expression itself, on the test database): no error, and a delay in
// [0, MaxRetryDelay].
func FuzzRetryDelay(f *testing.F) {
	db := testkit.NewPool(f)
	f.Add(maxRetryAttempts, 0, float64(maxRetryBase), int32(156))
	f.Add(maxRetryAttempts, maxRetryBackoffMS, float64(maxRetryBase), int32(maxRetryAttempts))
	f.Add(maxRetryAttempts, maxRetryBackoffMS, 1.0, int32(1))
	f.Add(3, 100, 2.0, int32(2))
	f.Add(5, 1, 0.0, int32(math.MaxInt32))
	f.Add(2, 10, 1.5, int32(math.MinInt32))
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, maxAttempts, initialMS int, base float64, attempts int32) {
		p := RetryPolicy{MaxAttempts: maxAttempts, InitialBackoffMS: initialMS, Base: base}
		inv := &apperr.InvalidError{}
		validateRetry(inv, "", p)
		if inv.OrNil() != nil {
			return
		}
		stored := base
		if stored == 0 {
			stored = 2 // as enqueueRows stores it
		}
		var delayMS float64
		var runAt time.Time
		err := db.QueryRow(context.Background(), `
			SELECT `+sqlRetryDelayMS+`, `+sqlRetryRunAt+`
			FROM (VALUES ($1::int, $2::float8, $4::int)) AS w(initial_backoff_ms, backoff_base, attempts)`,
			int32(initialMS), stored, now, attempts).Scan(&delayMS, &runAt)
		require.NoError(t, err, "policy %+v at attempts %d", p, attempts)
		require.False(t, math.IsNaN(delayMS))
		require.GreaterOrEqual(t, delayMS, 0.0)
		require.LessOrEqual(t, delayMS, float64(MaxRetryDelay.Milliseconds()))
		require.False(t, runAt.Before(now))
		require.False(t, runAt.After(now.Add(MaxRetryDelay)))
	})
}

// A handler that returns a NonRetryable error after its attempt's timeout
// passed has said the work cannot succeed: it fails at once instead of
// being retried as a timeout.
func TestExecutor_ANonRetryableErrorReturnedAfterTheTimeoutFailsWithoutRetry(t *testing.T) {
	t.Parallel()
	_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 5}})
	m.Register("late_final", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		<-ctx.Done() // the timeout passes while it works
		return nil, NonRetryable(errors.New("the input can never work"))
	})

	id := enqueueOn(t, m, EnqueueParams{Handler: "late_final", TimeoutMS: 20,
		Retry: &RetryPolicy{MaxAttempts: 5, InitialBackoffMS: 1, Base: 1}})

	s := requireFinished(t, m, "org-1", id, OutcomeFailed)
	require.Equal(t, 1, s.Attempts, "not retried")
	require.Equal(t, "the input can never work", s.Error)
}
