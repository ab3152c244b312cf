package workpool

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// commitQuery is the simple-protocol message pgx sends for tx.Commit.
var commitQuery = []byte("Q\x00\x00\x00\x0bcommit\x00")

// lateAnswer holds back the answer to the next COMMIT sent once armed:
// the server has committed, and the client has not read that yet. It is
// the one fault here that a test cannot cause through real parts on
// demand (on a loaded machine it is a goroutine descheduled for a few
// milliseconds), so it stands between pgx and the socket.
type lateAnswer struct {
	armed atomic.Bool
	// before runs between the COMMIT's send and the read of its answer;
	// the read then happens under whatever deadline it left.
	before func()
}

type lateAnswerConn struct {
	net.Conn
	la       *lateAnswer
	held     bool
	deadline chan struct{} // a deadline was set (pgx's context watcher)
}

func (c *lateAnswerConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, commitQuery) && c.la.armed.CompareAndSwap(true, false) {
		c.held = true
	}
	return c.Conn.Write(b)
}

func (c *lateAnswerConn) Read(b []byte) (int, error) {
	if c.held {
		c.held = false
		c.la.before()
	}
	return c.Conn.Read(b)
}

func (c *lateAnswerConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if !t.IsZero() {
		select {
		case c.deadline <- struct{}{}:
		default:
		}
	}
	return err
}

// A loop whose leadership ends while its iteration's COMMIT is in flight
// (a lost lock connection, a Stop) must still run what that commit
// started: the commit may land whatever the client's context says, and
// the work it handed to this executor is then running, claimed by it.
// Left unlaunched it stayed so until the heartbeat timeout recovered it —
// longer than anyone waits: a cancel found no handler to stop, and the
// work stayed "running" (api's TestWorkCancelOfRunningWorkFinishesItCanceled
// failed so under load).
func TestAnIterationWhoseLeadershipEndsAsItsCommitLandsStillRunsWhatItStarted(t *testing.T) {
	ctx := context.Background()
	dsn := testkit.NewDatabase(t)
	observer := testkit.NewPoolFor(t, dsn)
	la := &lateAnswer{}
	var deadlines chan struct{}
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lateAnswerConn{Conn: c, la: la, deadline: deadlines}, nil
	}
	deadlines = make(chan struct{}, 64)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	m, err := New(db, Config{Pools: map[string]int{"default": 10}, Logger: testkit.Logger(t)})
	require.NoError(t, err)
	ran := make(chan struct{})
	m.Register("block", func(ctx context.Context, _ Job) (json.RawMessage, error) {
		close(ran)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	m.exec.start()
	t.Cleanup(func() {
		m.exec.stopClaiming()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = m.exec.drain(sctx)
	})
	l := newLoop(m, "default")
	require.NoError(t, l.takeover(ctx))
	id, err := m.Enqueue(ctx, EnqueueParams{OrgID: "org-1", Pool: "default", Handler: "block"})
	require.NoError(t, err)

	leading, loseLeadership := context.WithCancel(ctx)
	defer loseLeadership()
	la.before = func() {
		// The start is committed: another connection sees it.
		require.Eventually(t, func() bool {
			var state string
			err := observer.QueryRow(ctx, `SELECT state FROM workpool_work WHERE id = $1`, id).Scan(&state)
			return err == nil && state == "running"
		}, testWait, testTick)
		for len(deadlines) > 0 {
			<-deadlines
		}
		loseLeadership()
		select { // a context pgx watches sets the connection's deadline when it ends
		case <-deadlines:
		case <-time.After(100 * time.Millisecond): // the fixed loop commits under another context
		}
	}
	la.armed.Store(true)

	_, _ = l.iterateFull(leading)

	require.False(t, la.armed.Load(), "the iteration committed")
	select {
	case <-ran:
	case <-time.After(testWait):
		t.Fatal("the started work's handler never ran: its start committed but was not launched")
	}
}
