package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/migrations"
)

func init() { benches["spend"] = benchSpend }

// spendBench is one run's parameters.
type spendBench struct {
	clients, n, mandates, batch int
	keyed                       bool
}

// benchSpend runs n spends of cost 1 from concurrent clients through the Go
// API (mandates.Spend, each its own transaction) against small budgets that
// run out before the end, so both the debit and the refusal path are
// measured; then it checks Σ ledger = spent ≤ budget for every mandate.
func benchSpend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench spend", flag.ContinueOnError)
	var b spendBench
	fs.IntVar(&b.clients, "clients", 16, "concurrent clients")
	fs.IntVar(&b.n, "n", 20000, "spends in all")
	fs.IntVar(&b.mandates, "mandates", 64, "mandates (agent, scope) the spends are spread over; 1 = one hot row")
	fs.BoolVar(&b.keyed, "keyed", true, "give every spend an idempotency key, as the wake-up path does")
	fs.IntVar(&b.batch, "batch", 64, "most concurrent spends one commit carries (mandates.Config.MaxSpendBatch; 1: a commit per spend)")
	dataDir := fs.String("data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: engine bench spend [flags]\n\nUses DATABASE_URL, or else starts a local Postgres (durable settings).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if b.clients < 1 || b.mandates < 1 || b.n < b.mandates || b.batch < 1 {
		return errors.New("need clients ≥ 1, mandates ≥ 1, n ≥ mandates, batch ≥ 1")
	}
	db, stop, err := benchDatabase(ctx, *dataDir, func(c *pgxpool.Config) { c.MaxConns = int32(max(b.clients+4, 8)) })
	if err != nil {
		return err
	}
	defer stop()
	if _, err := migrations.UpPool(ctx, db, nil); err != nil {
		return err
	}
	return b.run(ctx, db)
}

func (b spendBench) run(ctx context.Context, db *pgxpool.Pool) error {
	svc := mandates.New(db, mandates.Config{MaxSpendBatch: b.batch, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	org := "bench-" + uuid.NewString()
	defer b.deleteOrg(db, org)
	// Budgets cover 95 % of the spends, so the last ones are refused.
	budget := int64(b.n) * 95 / 100 / int64(b.mandates)
	for i := range b.mandates {
		if _, err := svc.Create(ctx, org, mandates.CreateParams{AgentID: fmt.Sprintf("agent-%d", i), Scope: "bench", Budget: budget}); err != nil {
			return err
		}
	}

	var next, ok, refused atomic.Int64
	errc := make(chan error, b.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for range b.clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.n) || ctx.Err() != nil {
					return
				}
				p := mandates.SpendParams{OrgID: org, AgentID: fmt.Sprintf("agent-%d", i%int64(b.mandates)), Scope: "bench", Cost: 1, Reason: "bench"}
				if b.keyed {
					p.IdempotencyKey = fmt.Sprintf("bench-%d", i)
				}
				r, err := svc.Spend(ctx, p)
				if err != nil {
					errc <- err
					return
				}
				if r.OK {
					ok.Add(1)
				} else {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return fmt.Errorf("spend: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	over, err := spendOverspend(ctx, db, org)
	if err != nil {
		return err
	}
	fmt.Printf("spend: n=%d clients=%d rate=%.0f/s overspend=%d (ok=%d refused=%d mandates=%d budget=%d each keyed=%t batch=%d, %s)\n",
		b.n, b.clients, float64(b.n)/elapsed.Seconds(), over, ok.Load(), refused.Load(), b.mandates, budget, b.keyed, b.batch,
		elapsed.Round(time.Millisecond))
	if over != 0 {
		return fmt.Errorf("invariant broken: %d units overspent or unaccounted", over)
	}
	if ok.Load() != budget*int64(b.mandates) {
		return fmt.Errorf("invariant broken: %d spends granted, budgets allow exactly %d", ok.Load(), budget*int64(b.mandates))
	}
	return nil
}

// spendOverspend sums, over the org's mandates, what was spent beyond the
// budget plus any difference between the ledger and spent.
func spendOverspend(ctx context.Context, db *pgxpool.Pool, org string) (int64, error) {
	var over int64
	err := db.QueryRow(ctx, `
		SELECT COALESCE(SUM(GREATEST(m.spent - m.budget, 0) + abs(m.spent - l.total)), 0)
		  FROM mandates m
		  CROSS JOIN LATERAL (SELECT COALESCE(SUM(amount), 0) AS total FROM mandate_ledger
		                       WHERE org_id = m.org_id AND mandate_id = m.id) l
		 WHERE m.org_id = $1`, org).Scan(&over)
	if err != nil {
		return 0, fmt.Errorf("checking the ledger: %w", err)
	}
	return over, nil
}

// deleteOrg removes the run's rows, so runs against a shared DATABASE_URL
// leave nothing behind.
func (b spendBench) deleteOrg(db *pgxpool.Pool, org string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, table := range []string{"mandate_ledger", "mandate_spends", "mandate_approvals", "mandates"} {
		_, _ = db.Exec(ctx, "DELETE FROM "+table+" WHERE org_id = $1", org)
	}
}
