package approvals

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// docs/approvals.md:141 lets a pending call wait up to 7 days (expires_in_s
// 10 s … 7 days), and docs/operations.md's alert on
// reveille_approvals_time_to_decision_seconds is "humans slow to answer".
// A human answer after two days must land in a finite bucket, or
// histogram_quantile reports at most the top finite bound (~4.5 h) however
// slow humans are.
func TestTimeToDecisionBucketsCoverTheLongestWaitACallMayHave(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, db := newTestService(t, Config{Registry: reg})
	ctx := context.Background()
	week := MaxExpiresIn
	res := request(t, s, "shell", "", func(p *RequestParams) { p.ExpiresIn = &week })
	require.Equal(t, DecisionPending, res.Decision)
	// The call was asked two days ago (its expiry is still 5 days away).
	_, err := db.Exec(ctx, `UPDATE tool_approvals SET created_at = created_at - interval '2 days' WHERE id = $1`, res.Approval.ID)
	require.NoError(t, err)
	_, err = respond(s, RespondParams{ApprovalID: res.Approval.ID, Decision: DecisionApproved})
	require.NoError(t, err)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "reveille_approvals_time_to_decision_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() != SourceHuman {
				continue
			}
			h := m.GetHistogram()
			require.EqualValues(t, 1, h.GetSampleCount())
			require.InDelta(t, 2*24*3600, h.GetSampleSum(), 60, "the wait observed")
			top := h.GetBucket()[len(h.GetBucket())-1]
			require.False(t, math.IsInf(top.GetUpperBound(), 1))
			require.GreaterOrEqual(t, top.GetUpperBound(), MaxExpiresIn.Seconds(), "the longest wait a call may have fits a finite bucket")
			require.EqualValues(t, 1, top.GetCumulativeCount(),
				"a 2-day wait (within the documented 7 days) falls past the top finite bucket le=%g (%s): only +Inf holds it",
				top.GetUpperBound(), time.Duration(top.GetUpperBound()*float64(time.Second)))
			return
		}
	}
	t.Fatal("reveille_approvals_time_to_decision_seconds{source=human} not found")
}
