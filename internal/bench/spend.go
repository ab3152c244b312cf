package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/mandates"
)

// SpendConfig is one `engine bench spend` run.
type SpendConfig struct {
	// Service is the engine's configuration; the run replaces its database
	// and the mandates' batch size.
	Service service.Config
	// N spends of cost 1 from Clients concurrent clients, spread over
	// Mandates mandates; Keyed gives each an idempotency key; Batch is the
	// most concurrent spends one commit carries.
	Clients, N, Mandates, Batch int
	Keyed                       bool
	// DataDir is where a local Postgres starts when Service has no
	// database (a temporary directory when empty).
	DataDir string
}

// Spend runs n spends of cost 1 from concurrent clients through the Go API
// (mandates.Spend, each its own transaction) against small budgets that
// run out before the end, so both the debit and the refusal path are
// measured; then it checks Σ ledger = spent ≤ budget for every mandate.
func Spend(ctx context.Context, c SpendConfig) error {
	if c.Clients < 1 || c.Mandates < 1 || c.N < c.Mandates || c.Batch < 1 {
		return errors.New("need clients ≥ 1, mandates ≥ 1, n ≥ mandates, batch ≥ 1")
	}
	w, err := setUp(ctx, c.Service, "spend", c.DataDir, false)
	defer w.tearDown(false)
	if err != nil {
		return err
	}
	cfg, _ := serviceConfig(c.Service, w, quiet)
	cfg.ConfigureDB = func(pc *pgxpool.Config) { pc.MaxConns = int32(max(c.Clients+4, 8)) }
	cfg.Mandates.MaxSpendBatch = c.Batch
	// Spending needs no background loop: the service is built, not run.
	svc, err := service.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	return c.run(ctx, svc.Mandates())
}

func (c SpendConfig) run(ctx context.Context, svc *mandates.Service) error {
	org := "bench-" + uuid.NewString()
	// Budgets cover 95 % of the spends, so the last ones are refused.
	budget := int64(c.N) * 95 / 100 / int64(c.Mandates)
	for i := range c.Mandates {
		if _, err := svc.Create(ctx, org, mandates.CreateParams{AgentID: fmt.Sprintf("agent-%d", i), Scope: "bench", Budget: budget}); err != nil {
			return err
		}
	}

	var next, ok, refused atomic.Int64
	errc := make(chan error, c.Clients)
	var wg sync.WaitGroup
	start := time.Now()
	for range c.Clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(c.N) || ctx.Err() != nil {
					return
				}
				p := mandates.SpendParams{OrgID: org, AgentID: fmt.Sprintf("agent-%d", i%int64(c.Mandates)), Scope: "bench", Cost: 1, Reason: "bench"}
				if c.Keyed {
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
	over, err := spendOverspend(ctx, svc, org)
	if err != nil {
		return err
	}
	fmt.Printf("spend: n=%d clients=%d rate=%.0f/s overspend=%d (ok=%d refused=%d mandates=%d budget=%d each keyed=%t batch=%d, %s)\n",
		c.N, c.Clients, float64(c.N)/elapsed.Seconds(), over, ok.Load(), refused.Load(), c.Mandates, budget, c.Keyed, c.Batch,
		elapsed.Round(time.Millisecond))
	if over != 0 {
		return fmt.Errorf("invariant broken: %d units overspent or unaccounted", over)
	}
	if ok.Load() != budget*int64(c.Mandates) {
		return fmt.Errorf("invariant broken: %d spends granted, budgets allow exactly %d", ok.Load(), budget*int64(c.Mandates))
	}
	return nil
}

// spendOverspend sums, over the org's mandates, what was spent beyond the
// budget plus any difference between the ledger and spent, read through
// the mandates' own API.
func spendOverspend(ctx context.Context, svc *mandates.Service, org string) (int64, error) {
	var over int64
	for p := (mandates.Page{Limit: mandates.MaxLimit}); ; {
		ms, next, err := svc.List(ctx, org, mandates.MandateFilter{}, p)
		if err != nil {
			return 0, fmt.Errorf("checking the ledger: %w", err)
		}
		for _, m := range ms {
			total, err := ledgerTotal(ctx, svc, m)
			if err != nil {
				return 0, err
			}
			over += max(m.Spent-m.Budget, 0) + abs(m.Spent-total)
		}
		if next == nil {
			return over, nil
		}
		p.Cursor = *next
	}
}

// ledgerTotal is the sum of m's ledger entries.
func ledgerTotal(ctx context.Context, svc *mandates.Service, m mandates.Mandate) (int64, error) {
	var total int64
	for p := (mandates.Page{Limit: mandates.MaxLimit}); ; {
		entries, next, err := svc.Ledger(ctx, m.OrgID, mandates.AnyAgent, m.ID, p)
		if err != nil {
			return 0, fmt.Errorf("checking the ledger: %w", err)
		}
		for _, e := range entries {
			total += e.Amount
		}
		if next == nil {
			return total, nil
		}
		p.Cursor = *next
	}
}

func abs(n int64) int64 { return max(n, -n) }
