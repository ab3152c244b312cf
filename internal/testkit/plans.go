package testkit

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Plans of prepared statements. pgx prepares every statement it sends, and
// Postgres plans a prepared statement for its parameters five times, then
// may reuse one generic plan, whose estimates know nothing of the
// parameters' values or of a subquery's: a predicate on them (an OR with
// "no cursor", "another org than the first") can then turn an index probe
// into a scan of the whole table. These helpers show such plans on a
// test's own tables, filled and analyzed as a busy system's would be.

// GenericPlan is the generic plan of sql (plan_cache_mode
// force_generic_plan), explained without running it: the plan Postgres
// would reuse once it stops planning sql per call.
func GenericPlan(t testing.TB, db *pgxpool.Pool, sql string, args []any) []string {
	t.Helper()
	return explainPrepared(t, db, sql, planRequest{explain: "EXPLAIN ", probe: args, generic: true})
}

// PlanAfter runs sql, prepared on one connection, with each of warm's
// arguments (as a client's requests on a pooled connection do), then
// returns the analyzed plan Postgres uses for probe: past five executions,
// the generic plan when it estimates it no dearer than the custom ones.
func PlanAfter(t testing.TB, db *pgxpool.Pool, sql string, warm [][]any, probe []any) []string {
	t.Helper()
	return explainPrepared(t, db, sql, planRequest{warm: warm, explain: analyze, probe: probe})
}

// PlanAfterChange is PlanAfter with change run between the warm-up and
// the probe: the plan a connection cached for the tables as they were,
// run on them as change left them (before any ANALYZE sees it).
func PlanAfterChange(t testing.TB, db *pgxpool.Pool, sql string, warm [][]any, change func(), probe []any) []string {
	t.Helper()
	return explainPrepared(t, db, sql, planRequest{warm: warm, change: change, explain: analyze, probe: probe})
}

// PlanAfterRolledBack is PlanAfter with every run — the warm-up's and
// the explained one — in a transaction rolled back: for a statement that
// writes what its next run would read differently (a start, fenced by the
// generation it bumps).
func PlanAfterRolledBack(t testing.TB, db *pgxpool.Pool, sql string, warm [][]any, probe []any) []string {
	t.Helper()
	return explainPrepared(t, db, sql, planRequest{warm: warm, explain: analyze, probe: probe, rollback: true})
}

const analyze = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "

// planRequest is how explainPrepared explains a statement: run with each
// of warm's arguments, then change, then explained (explain, the EXPLAIN
// and its options) with probe's; generic forces the generic plan;
// rollback runs each in a transaction rolled back.
type planRequest struct {
	warm     [][]any
	change   func()
	explain  string
	probe    []any
	generic  bool
	rollback bool
}

func explainPrepared(t testing.TB, db *pgxpool.Pool, sql string, r planRequest) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A connection whose session settings changed is not handed out again.
	defer func() { _ = conn.Conn().Close(ctx); conn.Release() }()
	if r.generic {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
	}
	sd, err := conn.Conn().Prepare(ctx, "plan_check", sql)
	if err != nil {
		t.Fatal(err)
	}
	// EXECUTE takes no protocol parameters of its own: the arguments go as
	// literals (the simple protocol), in their text forms.
	// run runs the statement with args (prefix: EXPLAIN and its options),
	// in a transaction rolled back when r.rollback says so.
	run := func(prefix string, args []any) []string {
		if len(args) != len(sd.ParamOIDs) {
			t.Fatalf("%d arguments for %d parameters", len(args), len(sd.ParamOIDs))
		}
		if r.rollback {
			if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = conn.Exec(ctx, "ROLLBACK") }()
		}
		text := append([]any{pgx.QueryExecModeSimpleProtocol}, textArgs(args)...)
		rows, err := conn.Query(ctx, prefix+"EXECUTE plan_check("+placeholders(len(args))+")", text...)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for rows.Next() {
			if prefix == "" {
				continue
			}
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return lines
	}
	for _, args := range r.warm {
		run("", args)
	}
	if r.change != nil {
		r.change()
	}
	return run(r.explain, r.probe)
}

func placeholders(n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("$%d", i+1)
	}
	return strings.Join(p, ", ")
}

func textArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = textArg(a)
	}
	return out
}

// textArg is an argument the simple protocol can spell: ids and tuple ids as text.
func textArg(a any) any {
	switch v := a.(type) {
	case [16]byte:
		return uuid.UUID(v).String()
	case uuid.UUID:
		return v.String()
	case *uuid.UUID:
		if v == nil {
			return nil
		}
		return v.String()
	case []uuid.UUID:
		out := make([]string, len(v))
		for i, id := range v {
			out[i] = id.String()
		}
		return out
	case [][16]byte:
		out := make([]string, len(v))
		for i, id := range v {
			out[i] = uuid.UUID(id).String()
		}
		return out
	case []pgtype.TID:
		out := make([]string, len(v))
		for i, tid := range v {
			out[i] = fmt.Sprintf("(%d,%d)", tid.BlockNumber, tid.OffsetNumber)
		}
		return out
	}
	return a
}

var buffers = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`)

// BuffersTouched is the shared buffers an analyzed plan's statement hit
// or read, as its top node counts them (its children's included).
func BuffersTouched(plan []string) int {
	for _, line := range plan {
		if m := buffers.FindStringSubmatch(line); m != nil {
			hit, _ := strconv.Atoi(m[1])
			read, _ := strconv.Atoi(m[2])
			return hit + read
		}
	}
	return 0
}

var removedByFilter = regexp.MustCompile(`Rows Removed by (?:Filter|Join Filter): (\d+)`)

// RowsThrownAway is the most rows one node of an analyzed plan
// (PlanAfter) read and threw away (Rows Removed by Filter or Join Filter).
func RowsThrownAway(plan []string) int {
	most := 0
	for _, line := range plan {
		if m := removedByFilter.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			most = max(most, n)
		}
	}
	return most
}

// RequireReadsAPage fails t when an analyzed plan (PlanAfter) threw away
// more than limit rows it read, or scanned a table whole.
func RequireReadsAPage(t testing.TB, name string, plan []string, limit int) {
	t.Helper()
	if n := RowsThrownAway(plan); n > limit {
		t.Errorf("%s reads %d rows it does not return:\n%s", name, n, strings.Join(plan, "\n"))
		return
	}
	for _, line := range plan {
		if strings.Contains(line, "Seq Scan on ") {
			t.Errorf("%s reads a whole table:\n%s", name, strings.Join(plan, "\n"))
			return
		}
	}
}

// LastQuery is a pgx tracer (NewTracedPool) keeping the last statement a
// pool sent and its arguments: what a test then explains (PlanAfter) as a
// caller's call sent it.
type LastQuery struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (l *LastQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql, l.args = d.SQL, append([]any(nil), d.Args...)
	return ctx
}

func (l *LastQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Last is the last statement sent and its arguments.
func (l *LastQuery) Last() (string, []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sql, l.args
}
