package testkit

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer noting each round trip a pool makes: a
// statement sent alone is one, a pipelined batch one however many
// statements it carries. (Preparing a statement a connection has not seen
// is a round trip too: count after a warm-up, so that each connection's
// statement cache already holds what is sent.) Set it as a pool config's
// ConnConfig.Tracer.
type RoundTrips struct {
	mu   sync.Mutex
	sent []string // what each round trip sent, first statement first
}

func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(abbreviate(d.SQL))
	return ctx
}

func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var stmts []string
	for _, q := range d.Batch.QueuedQueries {
		stmts = append(stmts, abbreviate(q.SQL))
	}
	r.add("batch[" + strings.Join(stmts, "; ") + "]")
	return ctx
}

func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (r *RoundTrips) add(sql string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, sql)
}

// Take returns what was sent since the last Take, a line per round trip,
// and forgets it.
func (r *RoundTrips) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sent
	r.sent = nil
	return out
}

// abbreviate is a statement's first words, enough to tell it: its verb and
// what it reads or writes, and the whole of a short one (or of one that
// notifies).
func abbreviate(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 60 && !strings.Contains(s, "pg_notify") {
		s = s[:60] + "…"
	}
	return s
}
