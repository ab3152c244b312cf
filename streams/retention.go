package streams

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/reveille/reveille/internal/leader"
)

// retentionRound runs while this replica leads RetentionLeadership, at
// once and then every PurgeInterval.
func (s *Service) retentionRound(ctx context.Context) error {
	n, err := s.PurgeClosedBefore(ctx, time.Now().Add(-s.cfg.Retention))
	if n > 0 {
		s.cfg.Logger.Info("purged expired streams", "count", n)
	}
	return err
}

// PurgeClosedBefore deletes every stream closed before cutoff, with its
// chunks, across orgs, in bounded batches (PurgeBatch streams, and as many
// chunks, per statement), so that no statement holds locks or builds WAL
// without bound. It returns the number of streams deleted. The retention
// loop calls it with its leadership's term in ctx, which fences each
// statement's transaction: once another replica has taken the leadership,
// it deletes nothing more and returns leader.ErrDeposed. Tests and tools
// may call it without a term.
func (s *Service) PurgeClosedBefore(ctx context.Context, cutoff time.Time) (int, error) {
	total := 0
	for {
		sctx, cancel := context.WithTimeout(ctx, leader.StatementTimeout) // (see leader.StatementTimeout)
		rows, err := s.db.Query(sctx, expiredSQL, cutoff, s.cfg.PurgeBatch)
		if err != nil {
			cancel()
			return total, fmt.Errorf("finding expired streams: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		cancel()
		if err != nil {
			return total, fmt.Errorf("finding expired streams: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		n, err := s.purge(ctx, ids)
		total += n
		if err != nil {
			return total, err
		}
		s.metrics.purged.Add(float64(n))
	}
}

func (s *Service) purge(ctx context.Context, ids []uuid.UUID) (int, error) {
	for _, q := range []struct{ what, sql string }{{"chunks", purgeChunksSQL}, {"append keys", purgeKeysSQL}} {
		for {
			n, err := s.fencedExec(ctx, q.sql, ids, s.cfg.PurgeBatch)
			if err != nil {
				return 0, fmt.Errorf("purging %s of expired streams: %w", q.what, err)
			}
			if n < int64(s.cfg.PurgeBatch) {
				break
			}
		}
	}
	n, err := s.fencedExec(ctx, purgeStreamsSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("purging expired streams: %w", err)
	}
	return int(n), nil
}

// fencedExec runs one bounded statement in a transaction of its own,
// fenced by ctx's leadership term, and returns the rows it affected.
func (s *Service) fencedExec(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := leader.FencedTx(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}
