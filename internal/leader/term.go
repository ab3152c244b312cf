package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/db"
)

// The advisory lock says who leads now, but not that a leader still does
// when its write lands: a leader whose lock connection died keeps running
// until it notices, while another replica already leads. Terms close that
// gap, as the pool's generation does for its loop: a new leader bumps its
// name's term in leader_terms before it leads, and every write of a
// leader-only loop holds the term it was handed (Hold, FencedTx, FenceSQL),
// so a deposed leader's writes fail with ErrDeposed instead of landing.

// ErrDeposed is returned by a fenced write of a leader whose term has been
// superseded: another replica took the leadership since.
var ErrDeposed = errors.New("leadership deposed: another replica took over")

// Term is one leadership term: the fencing token of a leader's writes.
type Term struct {
	Name string // the leadership's name (Elector.Name)
	N    int64  // its number in leader_terms; a later leader's is larger
}

type termKey struct{}

// WithTerm returns ctx carrying t, as the Elector hands it to a leader's fn.
func WithTerm(ctx context.Context, t Term) context.Context {
	return context.WithValue(ctx, termKey{}, t)
}

// TermFrom returns the term a leader's fn was handed, if ctx carries one.
func TermFrom(ctx context.Context) (Term, bool) {
	t, ok := ctx.Value(termKey{}).(Term)
	return t, ok
}

// NewTerm starts a new term of the named leadership and returns it: every
// earlier term's fenced writes fail from now on. It waits for those
// writes in flight (they hold the term row FOR SHARE), so none of them
// commits after it. The Elector calls it on taking the leadership; a test
// calls it to stand for a replica that took over.
func NewTerm(ctx context.Context, q db.Querier, name string) (Term, error) {
	t := Term{Name: name}
	err := q.QueryRow(ctx, `
		INSERT INTO leader_terms (name, term) VALUES ($1, 1)
		ON CONFLICT (name) DO UPDATE SET term = leader_terms.term + 1
		RETURNING term`, name).Scan(&t.N)
	if err != nil {
		return Term{}, fmt.Errorf("starting a term of leadership %s: %w", name, err)
	}
	return t, nil
}

// FenceSQL is the fencing condition, with the term's name and number at
// the given parameter positions: true only while that term is current. It
// locks the term row FOR SHARE, so the next NewTerm waits for the
// statement's transaction to end: a write that saw its term current
// commits before any later leader leads. Put it in a write's WHERE clause
// (with Term.Name and Term.N among its arguments), or let Hold run it at
// the start of a transaction.
func FenceSQL(nameParam, termParam int) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM leader_terms WHERE name = $%d AND term = $%d FOR SHARE)`, nameParam, termParam)
}

// fencedIdleBound is how long a fenced transaction may sit idle (between
// its statements) before the server ends it: far longer than any leader's
// write pauses.
var fencedIdleBound = 30 * time.Second

// Hold fences the rest of tx by ctx's term: it returns ErrDeposed if the
// term is no longer current, and otherwise keeps any later term from
// starting until tx ends. Without a term in ctx (a test or a tool calling
// a sweep directly, outside any leadership) there is nothing to be deposed
// from, and it does nothing.
func Hold(ctx context.Context, tx pgx.Tx) error {
	t, ok := TermFrom(ctx)
	if !ok {
		return nil
	}
	// (the transaction's idle time is bounded too: a leader that vanished
	// with its node or behind a partition mid-write leaves it idle on the
	// server, holding the term row, and the next NewTerm would wait on it
	// until TCP keepalive gave up on the peer, hours)
	var current bool
	err := tx.QueryRow(ctx, `SELECT `+FenceSQL(1, 2)+`, set_config('idle_in_transaction_session_timeout', $3, true)`,
		t.Name, t.N, strconv.FormatInt(fencedIdleBound.Milliseconds(), 10)).Scan(&current, nil)
	if err != nil {
		return fmt.Errorf("checking the term of leadership %s: %w", t.Name, err)
	}
	if !current {
		return fmt.Errorf("%s term %d: %w", t.Name, t.N, ErrDeposed)
	}
	return nil
}

// StatementTimeout bounds a leader's own statements that wait on no
// other transaction's locks — a fenced transaction's BEGIN, fence and
// COMMIT (FencedTx), a task's reads (a sweep's scan) —
// and should bound such statements of the tasks: a task runs under its
// leadership's context, which ends only when the lock's own connection
// fails, so a statement on another connection gone silent (a hung proxy;
// the dialer's TCP bounds catch a network that dropped it) stopped the
// task for every replica (the others stand by while the lock is held).
// Not the statements that may wait on a row lock (an upsert of an org's
// queue, a sweep's expiry of a locked row): a record with hooks holds its
// rows through its hook calls, and a bound cut such legitimate waits.
const StatementTimeout = 30 * time.Second

// FencedTx is pgx.BeginFunc for a leader's writes: fn runs in a
// transaction that Hold fences by ctx's term, and commits only if it
// returns nil. Its own round trips — BEGIN, the fence, COMMIT — give up
// after StatementTimeout; fn's statements are bounded as fn bounds them.
func FencedTx(ctx context.Context, conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, fn func(tx pgx.Tx) error) error {
	bounded := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, StatementTimeout) }
	bctx, cancel := bounded()
	tx, err := conn.Begin(bctx)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		// (after a commit: nothing to do; under its own bound, and not
		// ctx's, which may have ended: a rollback cut off closes the
		// connection)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StatementTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	hctx, cancel := bounded()
	err = Hold(hctx, tx)
	cancel()
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	cctx, cancel := bounded()
	defer cancel()
	return tx.Commit(cctx)
}
