package queue

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// settleMarker is in the text of the settle's "delivered" statement only.
const settleMarker = "SET status = 'delivered', delivered_at = now()"

// silentSettleDispatcher starts a dispatcher whose connections pass
// through a relay that holds back the answer to its first settle of sent
// signals: a connection gone silent mid-settle (a NAT that forgot it, a
// failover that left the old primary's connections blackholed). It
// returns the dispatcher, its signaler, a pool that bypasses the relay,
// and a channel closed once the settle went out.
func silentSettleDispatcher(t *testing.T, cfg DispatcherConfig) (*Dispatcher, *recordingSignaler, *pgxpool.Pool, <-chan struct{}) {
	t.Helper()
	dsn := testkit.NewDatabase(t)
	relay, relayed := testkit.NewRelay(t, dsn)
	db := testkit.NewPoolFor(t, relayed)
	t.Cleanup(relay.Cut)
	arrived, release := relay.HoldReplyTo(settleMarker)
	sig := newRecordingSignaler()
	cfg.Logger = testkit.Logger(t)
	cfg.StatementTimeout = time.Second
	d := NewDispatcher(db, sig, cfg)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	t.Cleanup(release) // (first: the stop above then returns)
	return d, sig, testkit.NewPoolFor(t, dsn), arrived
}

func TestAStopDuringASilentSettleEndsWhenTheSettleGivesUp(t *testing.T) {
	d, _, direct, arrived := silentSettleDispatcher(t, DispatcherConfig{})
	_, _, err := Enqueue(context.Background(), direct, signalParams("wf-1"))
	require.NoError(t, err)
	<-arrived // the settle went out; its answer never reaches the dispatcher

	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	require.NoError(t, d.Stop(ctx))
}

// The settler stuck on the connection would hold every slot of the
// pipeline: once BatchSize messages were claimed, no signal of the
// replica would be sent again.
func TestSignalsGoOnBeingSentPastASilentSettle(t *testing.T) {
	_, sig, direct, arrived := silentSettleDispatcher(t, DispatcherConfig{BatchSize: 2})
	_, _, err := Enqueue(context.Background(), direct, signalParams("wf-1"))
	require.NoError(t, err)
	<-arrived
	for _, wf := range []string{"wf-2", "wf-3", "wf-4"} {
		_, _, err := Enqueue(context.Background(), direct, signalParams(wf))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return sig.count("wf-4") == 1 }, testWait, testTick)
}
