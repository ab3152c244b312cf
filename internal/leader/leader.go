// Package leader elects one replica to run a leader-only task (sweepers,
// reconcilers): the replica that holds a session-level advisory lock on a
// dedicated connection is leader for as long as that connection lives. When
// the leader dies its connection closes (or, when it vanished without a
// word, the server ends the idle session: the lock is a lease), Postgres
// releases the lock, and a standby takes it over on its next try. Each leader starts a new term, and
// a leader-only loop's writes are fenced by it (term.go), so a leader that
// lost its lock without noticing yet writes nothing.
package leader

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Elector runs fn only while this process holds the named leadership.
type Elector struct {
	DB   *pgxpool.Pool
	Name string // e.g. "mandates.sweeper"; hashed into the advisory lock key
	// Retry is how often a standby tries to take over and how often a
	// leader checks that its connection is alive (default 2 s).
	Retry  time.Duration
	Logger *slog.Logger
}

// Key is the advisory lock key for a leadership name.
func Key(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("reveille.leader." + name))
	return int64(h.Sum64())
}

// Run blocks until ctx ends. Whenever this replica becomes leader it starts
// a new term (NewTerm) and calls fn with a context that carries the term
// (TermFrom) and is canceled when leadership is lost (or ctx ends), and
// waits for fn to return before trying again.
func (e *Elector) Run(ctx context.Context, fn func(ctx context.Context)) {
	retry := e.Retry
	if retry <= 0 {
		retry = 2 * time.Second
	}
	logger := e.Logger
	if logger == nil {
		logger = slog.Default()
	}
	key := Key(e.Name)
	for ctx.Err() == nil {
		e.term(ctx, key, retry, logger, fn)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// term tries to take the lock once and, if taken, leads until it is lost.
func (e *Elector) term(ctx context.Context, key int64, retry time.Duration, logger *slog.Logger, fn func(context.Context)) {
	conn, err := e.DB.Acquire(ctx)
	if err != nil {
		return
	}
	// The try and the lease are bounded as NewTerm is: on a connection gone
	// silent after the try reached the server, the server granted the lock
	// to a session whose client never heard of it, and no replica led until
	// the kernel gave up on the connection (this one waiting on the
	// answer, the others on the lock). Given up, the connection is closed,
	// and the server lets go of the lock with its session.
	step := max(10*retry, 10*time.Second)
	sctx, cancelStep := context.WithTimeout(ctx, step)
	defer cancelStep()
	var got bool
	if err := conn.QueryRow(sctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil || !got {
		conn.Release()
		return
	}
	// The connection now carries the lock: never hand it back to the pool.
	raw := conn.Hijack()
	defer raw.Close(context.Background())
	if err := holdAsLease(sctx, raw, retry); err != nil {
		if ctx.Err() == nil {
			logger.Warn("could not bound the leadership's lock connection; standing by", "leadership", e.Name, "error", err.Error())
		}
		return
	}
	// A new term waits for the old one's fenced writes in flight; bounded,
	// so that a write left open by a frozen process costs a retry, not the
	// leadership for good (closing raw releases the lock for another try).
	tctx, cancelTerm := context.WithTimeout(ctx, step)
	t, err := NewTerm(tctx, raw, e.Name)
	cancelTerm()
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("could not start a leadership term; standing by", "leadership", e.Name, "error", err.Error())
		}
		return
	}
	logger.Info("became leader", "leadership", e.Name, "term", t.N)
	lctx, cancel := context.WithCancel(WithTerm(ctx, t))
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); fn(lctx) }()
	lost := make(chan error, 1)
	go func() { lost <- watch(lctx, raw, retry) }()
	watching := true
	select {
	case <-done:
	case <-ctx.Done():
	case err := <-lost:
		watching = false
		if err != nil && ctx.Err() == nil {
			logger.Warn("lost leadership: lock connection failed", "leadership", e.Name, "error", err.Error())
		}
	}
	cancel()
	<-done
	if watching {
		<-lost
	}
}

// holdAsLease makes the lock a lease: the server ends the lock's session
// once it sits idle for LeaseFor(retry), which a live leader's watch never
// lets happen (it pings after every retry of silence). A leader that
// vanished with its node or behind a partition closes nothing, and without
// the bound Postgres would keep its session — and the lock, and every
// standby waiting — until its TCP keepalive gave up on the peer (two hours
// by the kernel's defaults). Postgres before 14 has no idle_session_timeout:
// there the lock is held as before.
func holdAsLease(ctx context.Context, conn *pgx.Conn, retry time.Duration) error {
	_, err := conn.Exec(ctx, "SELECT set_config('idle_session_timeout', $1, false)", strconv.FormatInt(LeaseFor(retry).Milliseconds(), 10))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object: no such setting
		return nil
	}
	return err
}

// LeaseFor is how long a leader's lock connection may sit idle before the
// server ends it: several of the leader's own pings apart, so that a
// loaded machine's late ping costs nothing.
func LeaseFor(retry time.Duration) time.Duration { return max(5*retry, 10*time.Second) }

// watch blocks on the lock connection until it fails (returning the error)
// or ctx ends (returning nil). Blocked in a read, it learns of a terminated
// backend or a closed socket the moment it happens, so the leader stops
// leading as soon as the lock is gone, not at its next check; a ping every
// retry covers a peer that vanished silently.
func watch(ctx context.Context, conn *pgx.Conn, retry time.Duration) error {
	for {
		wctx, wcancel := context.WithTimeout(ctx, retry)
		err := conn.PgConn().WaitForNotification(wctx)
		wcancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			continue // a notification: nobody listens on this connection
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		// A slow answer on a loaded machine is not a dead connection: the
		// ping gets at least 5 s, however short the retry.
		pctx, pcancel := context.WithTimeout(ctx, max(retry, 5*time.Second))
		err = conn.Ping(pctx)
		pcancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
