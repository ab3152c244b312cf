package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// closedAddr is a local address nothing listens on: a dial is refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// A DATABASE_URL pgx cannot parse stops serve before it dials anything
// (README: "before it connects to anything"): it was parsed only after
// the Temporal namespace check, so a Temporal that does not answer held
// the start 5 s, with a warning about Temporal, before the real error.
func TestServeRefusesAMalformedDatabaseURLBeforeDialingTemporal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	require.NoError(t, err)
	defer ln.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			defer c.Close()
		}
	}()
	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://u:pw@db.invalid:5432/reveille?sslmode=bogus")
	t.Setenv("TEMPORAL_ADDRESS", ln.Addr().String())
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
	t.Setenv("REVEILLE_ADDR", "127.0.0.1:0")

	err = runServe(context.Background(), nil)

	require.ErrorContains(t, err, "DATABASE_URL")
	require.NotContains(t, err.Error(), "pw@", "the password is masked")
	require.Zero(t, dialled.Load(), "Temporal was dialled before the malformed DATABASE_URL was refused")
}

// A stop asked for while serve waits for Postgres at start (a SIGTERM
// during a database outage) is a stop: serve returns no error (exit 0),
// where it reported "postgres does not answer: context canceled" and
// exited 1.
func TestAStopWhileServeWaitsForPostgresIsNotAFailure(t *testing.T) {
	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://postgres@"+closedAddr(t)+"/reveille?sslmode=disable&connect_timeout=1")
	t.Setenv("TEMPORAL_ADDRESS", closedAddr(t))
	t.Setenv("REVEILLE_JWT_SECRET", firstSecret)
	t.Setenv("REVEILLE_ADDR", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(time.Second, cancel) // the SIGTERM: stopOnSignal cancels the context

	require.NoError(t, runServe(ctx, nil))
}
