package load

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A wake-up not woken counts as lost only once its deadline has passed:
// one still within it when the run ends (interrupted) is not lost.
func TestSummaryCountsAWakeupLostOnlyPastItsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		acceptedAgo               time.Duration
		woken                     bool
		wantWoken, wantLost, want int
	}{
		{name: "woken", acceptedAgo: time.Second, woken: true, wantWoken: 1},
		{name: "not woken past its deadline", acceptedAgo: time.Hour, wantLost: 1},
		{name: "not woken within its deadline", acceptedAgo: 0, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := newRecorder()
			e := rc.expect("org/wf", kind{})
			rc.accepted(e, "")
			e.accepted = e.accepted.Add(-tc.acceptedAgo)
			if tc.woken {
				require.NoError(t, rc.woke(t.Context(), woken{WorkflowID: "org/wf", Outcome: "succeeded"}))
			}
			rep := rc.summary(time.Second, time.Minute)
			require.Equal(t, 1, rep.Accepted)
			require.Equal(t, tc.wantWoken, rep.Woken)
			require.Equal(t, tc.wantLost, rep.Lost)
			require.Equal(t, tc.want, rep.Interrupted)
		})
	}
}

// The load's work survives a replica killed mid-attempt (a kill drill), as
// a platform's would: every kind carries a retry policy, so a recovered
// attempt is retried instead of waking its workflow with "failed".
func TestEveryWakeupsWorkIsRetriedAfterALostAttempt(t *testing.T) {
	for _, k := range []kind{{}, {refused: true}, {canceled: true}} {
		req := wakeupRequest("a1", "org/wf", "http://127.0.0.1:9", k)
		require.NotNil(t, req.Work.Retry, "%+v", k)
		require.Greater(t, req.Work.Retry.MaxAttempts, 1, "%+v", k)
	}
}

// A count or a duration given as 0 is refused at start, naming its flag
// (engine load's flags hold the defaults): it was read as "the default",
// so --wakeups 0 ran 20,000 wake-ups. The run stops before it connects to
// anything (this one has nothing to connect to).
func TestAZeroCountOrDurationIsRefusedNamingItsFlagNotRunAsTheDefault(t *testing.T) {
	valid := Config{APIs: []string{"http://127.0.0.1:1"}, Wakeups: 5, Clients: 2, RefuseEvery: -1, CancelEvery: 20,
		Deadline: time.Minute, Progress: time.Second, Out: io.Discard}
	require.NoError(t, valid.validate())
	for flag, zero := range map[string]func(*Config){
		"--wakeups":      func(c *Config) { c.Wakeups = 0 },
		"--clients":      func(c *Config) { c.Clients = 0 },
		"--refuse-every": func(c *Config) { c.RefuseEvery = 0 },
		"--cancel-every": func(c *Config) { c.CancelEvery = 0 },
		"--deadline":     func(c *Config) { c.Deadline = 0 },
		"--progress":     func(c *Config) { c.Progress = 0 },
	} {
		t.Run(flag, func(t *testing.T) {
			c := valid
			zero(&c)
			_, err := Run(t.Context(), c)
			require.ErrorContains(t, err, flag+": must be ")
		})
	}
}

// A duration below a second is refused too, naming its flag: --progress
// 1ms printed progress lines back to back.
func TestASubSecondDeadlineOrProgressIsRefusedNamingItsFlag(t *testing.T) {
	valid := Config{APIs: []string{"http://127.0.0.1:1"}, Wakeups: 5, Clients: 2, RefuseEvery: -1, CancelEvery: 20,
		Deadline: time.Second, Progress: time.Second, Out: io.Discard}
	require.NoError(t, valid.validate(), "a second is enough")
	for flag, short := range map[string]func(*Config){
		"--deadline": func(c *Config) { c.Deadline = time.Millisecond },
		"--progress": func(c *Config) { c.Progress = time.Millisecond },
	} {
		t.Run(flag, func(t *testing.T) {
			c := valid
			short(&c)
			_, err := Run(t.Context(), c)
			require.ErrorContains(t, err, flag+": must be at least 1s, not 1ms")
		})
	}
}

// A refused (or canceled) wake-up is settled by its approve (its cancel):
// a wake before that request was sent is wrong — the refused work ran
// without its approval — however soon after it the approve was answered.
// It counted as a good wake with a latency of 0. Found by review.
func TestAWakeBeforeTheRequestThatSettlesItIsAWrongOutcome(t *testing.T) {
	for _, tc := range []struct {
		name      string
		k         kind
		outcome   string
		wokeFirst bool
		wantWrong int
	}{
		{name: "refused, woken before its approve", k: kind{refused: true}, outcome: "succeeded", wokeFirst: true, wantWrong: 1},
		{name: "refused, woken after its approve", k: kind{refused: true}, outcome: "succeeded"},
		{name: "canceled, woken before its cancel", k: kind{canceled: true}, outcome: "canceled", wokeFirst: true, wantWrong: 1},
		{name: "canceled, woken after its cancel", k: kind{canceled: true}, outcome: "canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := newRecorder()
			e := rc.expect("org/wf", tc.k)
			wake := func() {
				require.NoError(t, rc.woke(t.Context(), woken{WorkflowID: "org/wf", WakeupID: "w-1", Outcome: tc.outcome}))
			}
			if tc.wokeFirst {
				wake()
				time.Sleep(time.Millisecond) // (the clock moves between the two)
			}
			rc.settling(e)
			rc.accepted(e, "w-1")
			if !tc.wokeFirst {
				wake()
			}
			rep := rc.summary(time.Second, time.Minute)
			require.Equal(t, 1, rep.Woken)
			require.Equal(t, tc.wantWrong, rep.WrongOutcomes)
			if tc.wantWrong > 0 {
				require.Error(t, rep.verdict(time.Minute))
			} else {
				require.NoError(t, rep.verdict(time.Minute))
			}
		})
	}
}

// engine load --api A,B: "a call a replica does not answer goes to the
// next" — the token checks at the start too: with A down when the load
// starts, it ran on nothing; it checks the tokens at B. Found by review.
func TestAFirstReplicaDownAtTheStartIsPassedOverLikeAnyOtherCall(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // nothing listens there any more
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") == "Bearer approver-tok" {
			_, _ = io.WriteString(w, `{"org_id":"org","sub":"dev-approver","roles":["approver"]}`)
			return
		}
		_, _ = io.WriteString(w, `{"org_id":"org","sub":"dev-user","roles":["admin","agent","approver","operator"]}`)
	}))
	t.Cleanup(live.Close)
	r := &run{cfg: Config{APIs: []string{deadURL, live.URL}, Token: "agent-tok", ApproverToken: "approver-tok", Clients: 1}}
	require.NoError(t, r.connectAPIs(t.Context()), "replica B answers; the load runs on it as it does when A dies mid-run")
	require.Equal(t, "org", r.org)
}
