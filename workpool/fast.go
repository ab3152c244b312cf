package workpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// iterateFast runs sqlIterateFast: a whole iteration in one statement that
// fences itself and starts one org's plain ready work, handing this
// replica's executor its share — or, while the last start needed fair
// share (l.shared), a fair one: sqlIterateFastNear, or, while keyed work
// waits (l.keyed) or when the near pick could not decide,
// sqlIterateFastShared. The result is not clean when the full iteration
// must follow: it found a cancelation to process, ready work that needs
// fair share (the plain statement), or nothing at all (the full iteration
// then publishes the run status; so does a paused pool's, which starts
// nothing). Its plain says whether the ready work needs fair share; its
// wakeAt is the next start it saw.
func (l *loop) iterateFast(ctx context.Context, now time.Time) (iterResult, error) {
	if v := l.view; v != nil && (!l.shared || l.keyed || !v.until.IsZero() && !now.Before(v.until)) {
		l.dropView(ctx)
	}
	if reread := l.reread; reread && l.view == nil {
		l.reread = false
		if l.shared && !l.keyed && l.mayPlan() {
			l.tryView(ctx, now)
		}
	}
	if l.view != nil {
		res, decided, err := l.runPlanned(ctx, now)
		if err != nil || decided {
			return res, err
		}
		// the view no longer held: the near pick decides, at once
	}
	sql := sqlIterateFast
	switch {
	case l.shared && l.keyed:
		sql = sqlIterateFastShared
	case l.shared:
		sql = sqlIterateFastNear
	}
	res, decided, err := l.runFast(ctx, now, sql, l.shared)
	if err == nil && !decided {
		// Keyed work waits, or a near org's queue head is stale: the
		// full fair pick decides, at once.
		res, _, err = l.runFast(ctx, now, sqlIterateFastShared, true)
	}
	if err == nil && l.shared && !res.plain && !l.keyed && res.filled && l.view == nil && l.mayPlan() {
		// A fair start of several orgs' work that took every free slot
		// (work is left for the next): the next may be planned.
		l.tryView(ctx, now)
	}
	return res, err
}

// tryView reads a planned view for the next fair starts; one that cannot
// be read or cannot plan counts as a miss (the next waits out the backoff).
func (l *loop) tryView(ctx context.Context, now time.Time) {
	v, err := l.readView(ctx, now)
	switch {
	case errors.Is(err, errCannotPlan):
		// (a per-org cap, keyed work: ask again later, and less often
		// each time)
		l.planMisses++
		l.missedPlan()
	case err != nil:
		l.m.logger.Warn("reading the pool's fair view failed; its fair starts stay on the near pick for a while",
			"pool", l.pool, "error", err.Error())
		l.planMisses++
		l.missedPlan()
	case v != nil:
		l.view = v
	}
}

// runFast runs one fast iteration's statement (shared: a fair one) and
// launches what it started; decided is false when it was
// sqlIterateFastNear and could not pick (it then wrote nothing but the
// fence).
func (l *loop) runFast(ctx context.Context, now time.Time, sql string, shared bool) (res iterResult, decided bool, err error) {
	var (
		fenced, paused, plain, cancels, keyed, unseen bool
		nextAt                                        *time.Time
		free                                          int32
		s                                             startedWork
		charges                                       turnCharges
	)
	args, dest := append(l.startArgs(now), l.gen), []any{&fenced, &paused, &plain, &cancels, &nextAt, &decided, &keyed, &free, &unseen}
	if shared {
		args, dest = append(args, l.turns.args()...), append(dest, charges.dest()...)
	}
	b := &pgx.Batch{}
	// Losing this commit in a crash loses only starts (made again): nothing
	// promised.
	b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
	b.Queue(sql, args...).QueryRow(func(r pgx.Row) error {
		return r.Scan(append(dest, s.dest()...)...)
	})
	// Not canceled with the leadership: once sent, the statement's result
	// must be read, or the work it handed to this executor would sit claimed
	// and unrun until recovery. (A stale statement writes nothing anyway.)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.m.cfg.StatementTimeout)
	defer cancel()
	l.m.exec.claiming.RLock() // until its claims are launched
	defer l.m.exec.claiming.RUnlock()
	if err := l.m.db.SendBatch(sctx, b).Close(); err != nil {
		l.m.exec.claimLost()
		return iterResult{}, false, fmt.Errorf("fast iteration: %w", err)
	}
	if !fenced {
		return iterResult{}, false, fmt.Errorf("pool %s at generation %d: %w", l.pool, l.gen, errGenerationMismatch)
	}
	l.gen++
	l.turns.apply(charges)
	l.paused.Store(paused)
	if shared {
		l.keyed = keyed
	}
	l.launch(s)
	didWork := len(s.lags) > 0
	if didWork {
		l.fastStarts++
		l.lastActivity = now
	}
	res = iterResult{didWork: didWork, clean: (plain || shared) && !cancels, plain: plain, status: RunStatus{Kind: "running"},
		filled: didWork && len(s.lags) >= int(free), unseen: unseen}
	if nextAt != nil {
		res.wakeAt = *nextAt
	}
	return res, decided, nil
}
