package streams

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// retentionLoop runs while this replica leads "streams.retention": it purges
// at once, then every PurgeInterval.
func (s *Service) retentionLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.PurgeInterval)
	defer t.Stop()
	for {
		n, err := s.PurgeClosedBefore(ctx, time.Now().Add(-s.cfg.Retention))
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Logger.Warn("purging expired streams failed", "error", err.Error())
		case n > 0:
			s.cfg.Logger.Info("purged expired streams", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PurgeClosedBefore deletes every stream closed before cutoff, with its
// chunks, across orgs, in bounded batches (PurgeBatch streams, and as many
// chunks, per statement), so that no statement holds locks or builds WAL
// without bound. It returns the number of streams deleted.
func (s *Service) PurgeClosedBefore(ctx context.Context, cutoff time.Time) (int, error) {
	total := 0
	for {
		rows, err := s.db.Query(ctx, expiredSQL, cutoff, s.cfg.PurgeBatch)
		if err != nil {
			return total, fmt.Errorf("finding expired streams: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
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
			tag, err := s.db.Exec(ctx, q.sql, ids, s.cfg.PurgeBatch)
			if err != nil {
				return 0, fmt.Errorf("purging %s of expired streams: %w", q.what, err)
			}
			if tag.RowsAffected() < int64(s.cfg.PurgeBatch) {
				break
			}
		}
	}
	tag, err := s.db.Exec(ctx, purgeStreamsSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("purging expired streams: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
