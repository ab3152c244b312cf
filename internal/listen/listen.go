// Package listen keeps a process's LISTEN connection on one Postgres
// channel: opened outside the pool (it is held for the listener's life),
// pinged when silent, reconnected with capped backoff, with each
// notification and each reconnect reported to its owner. The streams hub
// and the approvals inbox hub fan their notifications out from it.
package listen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Loop is one channel's listen loop and what it reports to.
type Loop struct {
	DB      *pgxpool.Pool
	Channel string
	Name    string // names the owner in log lines, e.g. "streams hub"
	Logger  *slog.Logger
	// A connection silent for PingEvery is pinged, and the ping may take
	// PingTimeout: one whose peer vanished without a word would otherwise
	// wait forever.
	PingEvery, PingTimeout time.Duration

	Notify func(payload string) // each notification
	// Reconnected runs after the connection failed and listens again:
	// notifications sent meanwhile are lost, so readers should re-read.
	Reconnected func()
	Connected   func(*pgx.Conn) // optional: each new connection
	Pinged      func()          // optional: each successful ping
}

// Connect opens the connection and LISTENs on it.
func (l Loop) Connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.DB.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+l.Channel); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("LISTEN: %w", err)
	}
	if l.Connected != nil {
		l.Connected(conn)
	}
	return conn, nil
}

// Run listens on conn (from Connect) until ctx ends, reconnecting
// whenever the connection fails.
func (l Loop) Run(ctx context.Context, conn *pgx.Conn) {
	for {
		err := l.listen(ctx, conn)
		_ = conn.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		l.Logger.Warn(l.Name+": LISTEN connection failed; reconnecting", "error", err.Error())
		if conn = l.reconnect(ctx); conn == nil {
			return
		}
		l.Reconnected()
	}
}

// listen dispatches notifications until the connection fails or ctx ends.
func (l Loop) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, l.PingEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.Notify(n.Payload)
			continue
		case ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, l.PingTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		if l.Pinged != nil {
			l.Pinged()
		}
	}
}

// reconnect retries with capped backoff until it listens again or ctx
// ends (then nil).
func (l Loop) reconnect(ctx context.Context) *pgx.Conn {
	backoff := NewReconnectBackoff()
	for {
		conn, err := l.Connect(ctx)
		if err == nil {
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := backoff.Next()
		l.Logger.Warn(l.Name+": reconnect failed", "error", err.Error(), "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// The delays between a LISTEN connection's reconnect attempts: short at
// first (a connection cut while Postgres is up comes back at once), then
// doubling up to the cap, so that through an outage each listener tries
// — and logs a warning — at most every ReconnectMax.
const (
	ReconnectMin = 50 * time.Millisecond
	ReconnectMax = 5 * time.Second
)

// Backoff is a capped exponential delay: Next is Min, then twice the last
// one, up to Max; Reset starts it over. Not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	last     time.Duration
}

// NewReconnectBackoff is the backoff of a LISTEN connection's reconnects
// (ReconnectMin to ReconnectMax), which every listener in the process
// shares so that an outage is retried alike by all of them.
func NewReconnectBackoff() *Backoff { return &Backoff{Min: ReconnectMin, Max: ReconnectMax} }

// Next is the delay before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.last == 0 {
		b.last = b.Min
	} else {
		b.last = min(2*b.last, b.Max)
	}
	return b.last
}

// Reset makes the next delay Min again.
func (b *Backoff) Reset() { b.last = 0 }
