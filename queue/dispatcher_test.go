package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/reveille/reveille/internal/testkit"
)

// What Temporal's answer to a signal means: NotFound is not final — the
// workflow may be about to start — the request's own faults are, and
// anything else is worth a retry.
func TestClassifyTellsWhatEachSignalErrorMeans(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want sendKind
	}{
		{"accepted", nil, sendOK},
		{"workflow not found: perhaps not started yet", serviceerror.NewNotFound("workflow execution not found"), sendNotFound},
		{"workflow not found, wrapped", fmt.Errorf("signal: %w", serviceerror.NewNotFound("gone")), sendNotFound},
		{"invalid argument", serviceerror.NewInvalidArgument("bad signal name"), sendPermanent},
		{"permission denied", serviceerror.NewPermissionDenied("no", ""), sendPermanent},
		{"permission denied, wrapped", fmt.Errorf("signal: %w", serviceerror.NewPermissionDenied("no", "")), sendPermanent},
		{"unavailable", serviceerror.NewUnavailable("frontend down"), sendTransient},
		{"resource exhausted", serviceerror.NewResourceExhausted(0, "busy"), sendTransient},
		{"server deadline", serviceerror.NewDeadlineExceeded("slow"), sendTransient},
		{"our own send timeout", context.DeadlineExceeded, sendTransient},
		{"canceled at shutdown", context.Canceled, sendTransient},
		{"connection reset", errors.New("read: connection reset by peer"), sendTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, classify(tt.err))
		})
	}
}

// Settling NotFound answers: the message stays pending, counting its
// grace from the first NotFound, until the grace has passed; only then
// does it fail. A NotFound classified final would fail it at once.
func TestANotFoundSignalIsRetriedUntilItsGraceHasPassed(t *testing.T) {
	const grace = time.Minute
	notFound := serviceerror.NewNotFound("workflow execution not found")
	tests := []struct {
		name          string
		firstNotFound time.Duration // how long ago the first NotFound came (0: this is the first)
		wantStatus    string
	}{
		{name: "the first NotFound", firstNotFound: 0, wantStatus: StatusPending},
		{name: "inside the grace", firstNotFound: grace - 30*time.Second, wantStatus: StatusPending},
		{name: "a backoff from the grace's end", firstNotFound: grace - 12*time.Second, wantStatus: StatusPending},
		{name: "nearer the grace's end than any backoff", firstNotFound: grace - 2*time.Second, wantStatus: StatusFailed},
		{name: "past the grace", firstNotFound: grace + 5*time.Second, wantStatus: StatusFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := testkit.NewPool(t)
			ctx := context.Background()
			// (at least MinBackoff, 10 s, left of the grace for a retry)
			d := NewDispatcher(db, nil, DispatcherConfig{NotFoundGrace: grace, MinBackoff: 10 * time.Second, Logger: testkit.Logger(t)})
			m, _, err := Enqueue(ctx, db, signalParams("o/wf"))
			require.NoError(t, err)
			// (its third attempt: a backoff of 22.5–37.5 s, longer than
			// what is left of the grace in the near-end cases)
			_, err = db.Exec(ctx, `UPDATE queue_messages SET attempts = 2 WHERE id = $1`, m.ID)
			require.NoError(t, err)
			if tt.firstNotFound > 0 {
				_, err = db.Exec(ctx, `UPDATE queue_messages SET not_found_since = now() - $2::interval WHERE id = $1`, m.ID, tt.firstNotFound)
				require.NoError(t, err)
			}
			var sinceBefore *time.Time
			require.NoError(t, db.QueryRow(ctx, `SELECT not_found_since FROM queue_messages WHERE id = $1`, m.ID).Scan(&sinceBefore))
			msgs, err := d.claim(ctx, 10, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			r := sendResult{id: m.ID, err: notFound, attempts: msgs[0].Attempts, notFoundSince: msgs[0].notFoundSince}

			require.NoError(t, d.settle(ctx, msgs, []sendResult{r}))

			got, err := Get(ctx, db, "o", m.ID)
			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, got.Status, got.LastError)
			if tt.wantStatus == StatusPending {
				var since *time.Time
				require.NoError(t, db.QueryRow(ctx, `SELECT not_found_since FROM queue_messages WHERE id = $1`, m.ID).Scan(&since))
				require.NotNil(t, since, "the grace is counted from the first NotFound")
				if sinceBefore != nil {
					require.True(t, since.Equal(*sinceBefore), "and kept across retries: %s, then %s", *sinceBefore, *since)
				}
				// (the dispatcher carries the first NotFound's age into its
				// own clock, which lags the database's by the claim's and
				// the settle's latency — tens of ms on a loaded machine; a
				// backoff past the grace would be seconds past it)
				var next time.Time
				require.NoError(t, db.QueryRow(ctx, `SELECT next_attempt_at FROM queue_messages WHERE id = $1`, m.ID).Scan(&next))
				require.False(t, next.After(since.Add(grace).Add(time.Second)),
					"the last try comes when the grace ends, not a backoff past it: next %s, grace ends %s", next, since.Add(grace))
			}
		})
	}
}

// A send that fails for a passing reason (Temporal unavailable) is an info
// line naming Temporal, the message and its workflow; every fifth failure
// of one message is a warn line, so that an outage shows at the warn level
// without a line per retry of every message.
func TestASignalThatKeepsFailingIsLoggedAsAWarningNowAndThen(t *testing.T) {
	for _, tc := range []struct {
		attemptsBefore int32
		level          string
	}{{0, "INFO"}, {sendFailuresBeforeWarn - 1, "WARN"}, {sendFailuresBeforeWarn, "INFO"}, {2*sendFailuresBeforeWarn - 1, "WARN"}} {
		t.Run(fmt.Sprintf("failure %d", tc.attemptsBefore+1), func(t *testing.T) {
			db := testkit.NewPool(t)
			ctx := context.Background()
			var logs testkit.LogBuffer
			d := NewDispatcher(db, nil, DispatcherConfig{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			m, _, err := Enqueue(ctx, db, signalParams("o/wf"))
			require.NoError(t, err)
			_, err = db.Exec(ctx, `UPDATE queue_messages SET attempts = $2 WHERE id = $1`, m.ID, tc.attemptsBefore)
			require.NoError(t, err)
			msgs, err := d.claim(ctx, 10, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			r := sendResult{id: m.ID, err: serviceerror.NewUnavailable("frontend down"), attempts: msgs[0].Attempts}
			require.NoError(t, d.settle(ctx, msgs, []sendResult{r}))

			var line map[string]any
			require.NoError(t, json.Unmarshal([]byte(logs.String()), &line), logs.String())
			require.Equal(t, tc.level, line["level"])
			require.Contains(t, line["msg"], "Temporal")
			require.Equal(t, "o/wf", line["workflow_id"])
			require.Equal(t, m.ID.String(), line["message_id"])
		})
	}
}

// startingWorkflow answers NotFound until the workflow has "started" (after
// a number of calls), then accepts: a signal sent just before its workflow
// starts.
type startingWorkflow struct {
	mu       sync.Mutex
	notFound int // NotFound answers left
	accepted int
}

func (s *startingWorkflow) SignalWorkflow(context.Context, string, string, string, any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.notFound > 0 {
		s.notFound--
		return serviceerror.NewNotFound("workflow execution not found")
	}
	s.accepted++
	return nil
}

// A signal to a workflow that starts moments after it is queued is
// delivered once the workflow exists, by the running dispatcher.
func TestASignalToAWorkflowAboutToStartIsDeliveredWithinTheGrace(t *testing.T) {
	db := testkit.NewPool(t)
	wf := &startingWorkflow{notFound: 3}
	startDispatcher(t, db, wf, DispatcherConfig{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	_, _, err := Enqueue(context.Background(), db, signalParams("o/starting"))
	require.NoError(t, err)

	m := requireDelivered(t, db, "o/starting")

	require.Equal(t, 4, m.Attempts, "three NotFound answers, then the delivery")
	wf.mu.Lock()
	defer wf.mu.Unlock()
	require.Equal(t, 1, wf.accepted)
}

// A retry is due a backoff after the database's now(), which the claim
// compares next_attempt_at with: a host whose clock runs ahead of the
// database's set it late by the skew — and, waiting by its own clock,
// woke when it was not yet due and polled every millisecond until it was;
// a host behind set it early and slept past it by the skew.
func TestARetryIsDueABackoffAfterTheDatabasesClockWhateverTheHostsSays(t *testing.T) {
	const backoff = 10 * time.Second
	for _, tt := range []struct {
		name string
		skew time.Duration
		err  error
	}{
		{"host an hour ahead, Temporal unavailable", time.Hour, serviceerror.NewUnavailable("down")},
		{"host an hour behind, Temporal unavailable", -time.Hour, serviceerror.NewUnavailable("down")},
		{"host an hour ahead, workflow not found", time.Hour, serviceerror.NewNotFound("workflow execution not found")},
		{"host an hour behind, workflow not found", -time.Hour, serviceerror.NewNotFound("workflow execution not found")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db := testkit.NewPool(t)
			ctx := context.Background()
			d := NewDispatcher(db, nil, DispatcherConfig{MinBackoff: backoff, MaxBackoff: backoff, NotFoundGrace: 10 * time.Minute,
				Logger: testkit.Logger(t)})
			d.now = func() time.Time { return time.Now().Add(tt.skew) }
			m, _, err := Enqueue(ctx, db, signalParams("o/wf"))
			require.NoError(t, err)
			msgs, err := d.claim(ctx, 10, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			require.NoError(t, d.settle(ctx, msgs, []sendResult{{id: m.ID, err: tt.err, attempts: msgs[0].Attempts}}))

			var dueIn float64
			require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM next_attempt_at - now()) FROM queue_messages WHERE id = $1`,
				m.ID).Scan(&dueIn))
			// (the backoff's jitter: 0.75–1.25 of it)
			require.InDelta(t, backoff.Seconds(), dueIn, backoff.Seconds()/4+1, "due in %.1f s by the database's clock", dueIn)
			wait, _ := d.untilNextDue(ctx, nil)
			require.InDelta(t, dueIn, wait.Seconds(), 1, "the dispatcher sleeps until it is due: %s", wait)
		})
	}
}

// The grace of a signal to an absent workflow runs from its first
// NotFound by the database's clock: any replica may claim the retry, and
// one whose clock is ahead of the first's by more than the grace failed
// the message at once (a workflow about to start lost its wake-up).
func TestTheNotFoundGraceIsNotCutShortByAnotherReplicasClock(t *testing.T) {
	db := testkit.NewPool(t)
	ctx := context.Background()
	notFound := serviceerror.NewNotFound("workflow execution not found")
	cfg := DispatcherConfig{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Logger: testkit.Logger(t)}
	behind := NewDispatcher(db, nil, cfg)
	behind.now = func() time.Time { return time.Now().Add(-2 * time.Minute) }
	onTime := NewDispatcher(db, nil, cfg)

	m, _, err := Enqueue(ctx, db, signalParams("o/wf"))
	require.NoError(t, err)
	msgs, err := behind.claim(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, behind.settle(ctx, msgs, []sendResult{{id: m.ID, err: notFound, attempts: msgs[0].Attempts}}))

	time.Sleep(50 * time.Millisecond) // the retry is due
	msgs, err = onTime.claim(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, onTime.settle(ctx, msgs, []sendResult{{id: m.ID, err: notFound, attempts: msgs[0].Attempts, notFoundSince: msgs[0].notFoundSince}}))

	got, err := Get(ctx, db, "o", m.ID)
	require.NoError(t, err)
	require.Equal(t, StatusPending, got.Status, "failed after %s of NotFound: %s", 50*time.Millisecond, got.LastError)
}
