package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reveille/reveille/internal/apperr"
)

// Limits on a retry policy, so that a typo cannot schedule work for a year.
const (
	maxRetryAttempts  = 1000
	maxRetryBackoffMS = 24 * 3600 * 1000
	maxRetryBase      = 100
	maxKeyLimit       = 10_000
	// maxConcurrencyKey bounds a concurrency key, in characters.
	maxConcurrencyKey = 200
)

// MaxRetryDelay bounds the wait before any retry, whatever the policy:
// initial_backoff_ms·base^(attempt−1) grows past it (and past what a float
// can hold) long before max_attempts runs out.
const MaxRetryDelay = 24 * time.Hour

// The SQL spellings of the delay's bounds (sqlRetryDelayMS).
const (
	maxRetryDelayMS  = "86400000" // MaxRetryDelay in ms
	retryExponentCap = "20"       // e^20·0.5 > 86,400,000
)

// Enqueue adds one work item in its own transaction and wakes its pool's
// loop. Bad input is an *apperr.InvalidError naming the field ("pool",
// "handler", "retry.max_attempts", …).
func (m *Manager) Enqueue(ctx context.Context, p EnqueueParams) (uuid.UUID, error) {
	ids, err := m.EnqueueMany(ctx, []EnqueueParams{p})
	if err != nil {
		return uuid.Nil, unprefix(err)
	}
	return ids[0], nil
}

// EnqueueTx is Enqueue inside the caller's transaction: the work exists,
// and the loop is woken, only if tx commits.
func (m *Manager) EnqueueTx(ctx context.Context, tx pgx.Tx, p EnqueueParams) (uuid.UUID, error) {
	ids, err := m.EnqueueManyTx(ctx, tx, []EnqueueParams{p})
	if err != nil {
		return uuid.Nil, unprefix(err)
	}
	return ids[0], nil
}

// EnqueueMany adds a batch atomically (one statement), returning the ids in
// order. Invalid fields are named with the item's index: "[3].handler".
func (m *Manager) EnqueueMany(ctx context.Context, ps []EnqueueParams) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		var err error
		ids, err = m.EnqueueManyTx(ctx, tx, ps)
		return err
	})
	return ids, err
}

// EnqueueManyTx is EnqueueMany inside the caller's transaction.
func (m *Manager) EnqueueManyTx(ctx context.Context, tx pgx.Tx, ps []EnqueueParams) ([]uuid.UUID, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	rows, err := m.enqueueRows(ps)
	if err != nil {
		return nil, err
	}
	fresh := len(ps)
	var replay []bool
	if rows.replay != nil {
		if fresh, err = m.claimKeys(ctx, tx, rows); err != nil {
			return nil, err
		}
		if fresh == 0 {
			return rows.ids, nil
		}
		replay = rows.replay
	}
	b := &pgx.Batch{}
	q := m.queueFirstTry(b, ps, rows, replay)
	var inserted int64
	q.insert.Exec(func(tag pgconn.CommandTag) error {
		inserted = tag.RowsAffected()
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("enqueueing %d work items: %w", len(ps), err)
	}
	if inserted == int64(fresh) {
		return rows.ids, nil
	}
	groups, first, args, limit := q.groups, q.first, q.args, int64(m.cfg.MaxPendingPerOrg)
	// Nothing was inserted: a count past its cap, or an unknown pool.
	again := first // the insert's second try
	if groups != nil {
		if err := m.admitOverCap(ctx, tx, groups); err != nil {
			return nil, err
		}
		if len(groups.pools) == 1 {
			// The first try already added the items to the pair's count:
			// test it (when the cap applies) without counting again.
			pool, org := groups.pools[0], groups.orgs[0]
			if !groups.checked[0] {
				pool, org = "", ""
			}
			again = pgx.QueuedQuery{SQL: sqlEnqueue, Arguments: append(slices.Clip(args), pool, org, limit)}
		}
	}
	tag, err := tx.Exec(ctx, again.SQL, again.Arguments...)
	if err != nil {
		return nil, fmt.Errorf("enqueueing %d work items: %w", len(ps), err)
	}
	if tag.RowsAffected() != int64(fresh) {
		return nil, m.unknownPools(ctx, tx, ps)
	}
	return rows.ids, nil
}

// firstTry is the statements of an enqueue's first round trip, queued by
// queueFirstTry.
type firstTry struct {
	groups *pendingGroups // nil: the cap is off
	first  pgx.QueuedQuery
	args   []any
	insert *pgx.QueuedQuery // first, as queued: its tag counts the inserted items
	others int              // statements queued before the insert
}

// queueFirstTry queues the enqueue's one round trip in b: count the items
// toward their orgs' caps, insert them unless a count went past its cap,
// wake the loops (when the transaction commits).
func (m *Manager) queueFirstTry(b *pgx.Batch, ps []EnqueueParams, rows *enqueueRows, replay []bool) firstTry {
	q := firstTry{groups: m.pendingGroups(ps, rows)}
	q.args = []any{pgUUIDs(rows.ids), rows.orgs, rows.pools, rows.handlers, rows.args, rows.runAts, rows.maxAttempts,
		rows.backoffMS, rows.bases, rows.timeouts, rows.hooks, rows.hookContexts, rows.keys, rows.keyLimits,
		int32(len(rows.poolSet)), m.now(), replay}
	limit := int64(m.cfg.MaxPendingPerOrg)
	switch g := q.groups; {
	case g == nil: // the cap is off: nothing to count or test
		q.first = pgx.QueuedQuery{SQL: sqlEnqueueInsert, Arguments: q.args}
	case len(g.pools) == 1:
		q.first = pgx.QueuedQuery{SQL: sqlEnqueueCounted, Arguments: append(slices.Clip(q.args),
			g.pools[0], g.orgs[0], limit, g.counts[0], g.checked[0])}
	default:
		b.Queue(sqlAddPending, g.pools, g.orgs, g.counts, m.now())
		q.others = 1
		q.first = pgx.QueuedQuery{SQL: sqlEnqueueGroups,
			Arguments: append(slices.Clip(q.args), g.checkPools, g.checkOrgs, limit, g.checkKeys)}
	}
	q.insert = b.Queue(q.first.SQL, q.first.Arguments...)
	kicks := make([]string, 0, len(rows.poolSet))
	for p := range rows.poolSet {
		kicks = append(kicks, "e:"+p)
	}
	b.Queue(sqlNotifyEach, kicks)
	return q
}

// QueuedEnqueue is an enqueue queued in a caller's batch by QueueEnqueue.
type QueuedEnqueue struct {
	// IDs are the items' ids, in order, fixed before the batch is sent, so
	// that statements queued after the enqueue can refer to them.
	IDs []uuid.UUID
	q   firstTry
}

// ErrNotEnqueued is Read's answer when a queued enqueue inserted nothing:
// a pool it names does not exist (Enqueue would name it).
var ErrNotEnqueued = errors.New("nothing was enqueued: a pool does not exist")

// QueueEnqueue queues in b what EnqueueManyTx sends in its one round trip,
// for a caller that sends b in a transaction of its own beside statements
// of its own (the wake-up's second transaction: its marks and its commit
// travel with the enqueue). It takes only work already owed, whose enqueue
// never needs a second try: every item BypassPendingCap, none with an
// IdempotencyKey. Invalid items are an *apperr.InvalidError, as from
// EnqueueMany. The items are counted, inserted and their loops woken when
// the caller's transaction commits; Read reports whether they were
// inserted. When they were not, what else the transaction did may still
// commit: their counts then only overstate the bound, which a recount
// repairs, so statements that depend on the items should test for them.
func (m *Manager) QueueEnqueue(b *pgx.Batch, ps []EnqueueParams) (*QueuedEnqueue, error) {
	for i, p := range ps {
		if !p.BypassPendingCap || p.IdempotencyKey != "" {
			return nil, fmt.Errorf("workpool: QueueEnqueue takes owed work without idempotency keys (item %d)", i)
		}
	}
	rows, err := m.enqueueRows(ps)
	if err != nil {
		return nil, err
	}
	return &QueuedEnqueue{IDs: rows.ids, q: m.queueFirstTry(b, ps, rows, nil)}, nil
}

// Read takes the enqueue's results from br, in b's queue order: nil once
// every item was inserted, ErrNotEnqueued when none was.
func (e *QueuedEnqueue) Read(br pgx.BatchResults) error {
	for range e.q.others {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("enqueueing %d work items: %w", len(e.IDs), err)
		}
	}
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec() // the loops' wake-up
	}
	if err != nil {
		return fmt.Errorf("enqueueing %d work items: %w", len(e.IDs), err)
	}
	if tag.RowsAffected() != int64(len(e.IDs)) {
		return ErrNotEnqueued
	}
	return nil
}

// unknownPools names the items whose pool does not exist.
func (m *Manager) unknownPools(ctx context.Context, q Querier, ps []EnqueueParams) error {
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		names = append(names, p.Pool)
	}
	rows, err := q.Query(ctx, sqlKnownPools, names)
	if err != nil {
		return fmt.Errorf("checking pools: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("checking pools: %w", err)
	}
	have := map[string]bool{}
	for _, k := range known {
		have[k] = true
	}
	inv := &apperr.InvalidError{}
	for i, p := range ps {
		if !have[p.Pool] {
			inv.Add(itemField(i, "pool"), fmt.Sprintf("unknown pool %q", p.Pool))
		}
	}
	if err := inv.OrNil(); err != nil {
		return err
	}
	return fmt.Errorf("enqueueing: a pool disappeared while enqueueing")
}

type enqueueRows struct {
	ids          []uuid.UUID
	orgs         []string
	pools        []string
	handlers     []string
	args         []string
	runAts       []time.Time
	maxAttempts  []int32
	backoffMS    []int32
	bases        []float64
	timeouts     []int32
	hooks        []*string
	hookContexts []*string
	keys         []*string
	keyLimits    []*int32
	poolSet      map[string]bool
	// Idempotency keys (nil unless some item has one): a replayed item
	// takes the first enqueue's id and is not inserted.
	idemKeys []*string
	hashes   [][]byte
	replay   []bool
}

func (m *Manager) enqueueRows(ps []EnqueueParams) (*enqueueRows, error) {
	n := len(ps)
	r := &enqueueRows{
		ids: make([]uuid.UUID, n), orgs: make([]string, n), pools: make([]string, n), handlers: make([]string, n),
		args: make([]string, n), runAts: make([]time.Time, n), maxAttempts: make([]int32, n), backoffMS: make([]int32, n),
		bases: make([]float64, n), timeouts: make([]int32, n), hooks: make([]*string, n), hookContexts: make([]*string, n),
		keys: make([]*string, n), keyLimits: make([]*int32, n), poolSet: map[string]bool{},
	}
	inv := &apperr.InvalidError{}
	now := m.now()
	for i, p := range ps {
		prefix := ""
		if n > 1 {
			prefix = "[" + strconv.Itoa(i) + "]."
		}
		m.validate(inv, prefix, p)
		r.ids[i] = newID()
		r.orgs[i], r.pools[i], r.handlers[i] = p.OrgID, p.Pool, p.Handler
		r.args[i] = "{}"
		if len(p.Args) > 0 {
			r.args[i] = string(p.Args)
		}
		r.runAts[i] = p.RunAt
		if p.RunAt.IsZero() && !p.RunAtSet {
			r.runAts[i] = now
		}
		r.maxAttempts[i], r.bases[i] = 1, 2
		if p.Retry != nil {
			r.maxAttempts[i], r.backoffMS[i] = int32(p.Retry.MaxAttempts), int32(p.Retry.InitialBackoffMS)
			if p.Retry.Base != 0 {
				r.bases[i] = p.Retry.Base
			}
		}
		r.timeouts[i] = DefaultTimeoutMS
		if p.TimeoutMS > 0 {
			r.timeouts[i] = int32(p.TimeoutMS)
		}
		if p.OnComplete != nil {
			hook := p.OnComplete.Hook
			r.hooks[i] = &hook
			if len(p.OnComplete.Context) > 0 {
				c := string(p.OnComplete.Context)
				r.hookContexts[i] = &c
			}
		}
		if p.ConcurrencyKey != "" {
			key, limit := p.ConcurrencyKey, int32(max(p.KeyLimit, 1))
			r.keys[i], r.keyLimits[i] = &key, &limit
		}
		r.poolSet[p.Pool] = true
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	// (fingerprints need valid items)
	r.addIdempotencyKeys(inv, ps)
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return r, nil
}

// addIdempotencyKeys fills the key columns of a batch in which some item
// has a key; a key repeated within the batch is refused (it could name
// only one of the items).
func (r *enqueueRows) addIdempotencyKeys(inv *apperr.InvalidError, ps []EnqueueParams) {
	first := map[idemKey]int{}
	for i, p := range ps {
		if p.IdempotencyKey == "" {
			continue
		}
		if r.idemKeys == nil {
			r.idemKeys, r.hashes, r.replay = make([]*string, len(ps)), make([][]byte, len(ps)), make([]bool, len(ps))
		}
		k := idemKey{p.OrgID, p.Pool, p.IdempotencyKey}
		if j, dup := first[k]; dup {
			inv.Add(itemField(i, "idempotency_key"), fmt.Sprintf("repeats the key of item %d", j))
			continue
		}
		first[k] = i
		key := p.IdempotencyKey
		r.idemKeys[i], r.hashes[i] = &key, requestHash(p)
	}
}

// validate checks one item; fields are named as in the REST body.
func (m *Manager) validate(inv *apperr.InvalidError, prefix string, p EnqueueParams) {
	if p.OrgID == "" {
		inv.Add(prefix+"org_id", "must not be empty")
	}
	switch {
	case p.Pool == "":
		inv.Add(prefix+"pool", "must not be empty")
	case !poolNameRE.MatchString(p.Pool):
		// (no pool has such a name; a long one would also overflow the
		// enqueue's NOTIFY payload, failing its statement)
		inv.Add(prefix+"pool", fmt.Sprintf("unknown pool %q", p.Pool))
	}
	switch {
	case p.Handler == "":
		inv.Add(prefix+"handler", "must not be empty")
	case !m.HasHandler(p.Handler):
		inv.Add(prefix+"handler", fmt.Sprintf("unknown handler %q", p.Handler))
	}
	switch check, ok := m.argsCheck(p.Handler); {
	case len(p.Args) > 0 && !json.Valid(p.Args):
		inv.Add(prefix+"args", "must be valid JSON")
	case len(p.Args) > maxArgsBytes:
		inv.Add(prefix+"args", fmt.Sprintf("must be at most %d bytes", maxArgsBytes))
	case ok && !p.SkipArgsCheck:
		check(p.Args, func(field, detail string) {
			name := prefix + "args"
			if field != "" {
				name += "." + field
			}
			inv.Add(name, detail)
		})
	}
	if p.Retry != nil {
		validateRetry(inv, prefix, *p.Retry)
	}
	if p.TimeoutMS < 0 || p.TimeoutMS > MaxTimeoutMS {
		inv.Add(prefix+"timeout_ms", fmt.Sprintf("must be from 1 to %d milliseconds (0 for the default, %d)", MaxTimeoutMS, DefaultTimeoutMS))
	}
	if p.OnComplete != nil {
		if _, ok := m.hook(p.OnComplete.Hook); !ok {
			inv.Add(prefix+"on_complete.hook", fmt.Sprintf("unknown hook %q", p.OnComplete.Hook))
		}
		if len(p.OnComplete.Context) > 0 && !json.Valid(p.OnComplete.Context) {
			inv.Add(prefix+"on_complete.context", "must be valid JSON")
		}
	}
	switch k := p.IdempotencyKey; {
	case len(k) > maxIdempotencyKey:
		inv.Add(prefix+"idempotency_key", fmt.Sprintf("must be at most %d bytes", maxIdempotencyKey))
	case !utf8.ValidString(k) || strings.ContainsRune(k, 0):
		inv.Add(prefix+"idempotency_key", "must be valid UTF-8 without NUL characters")
	}
	switch k := p.ConcurrencyKey; {
	case utf8.RuneCountInString(k) > maxConcurrencyKey:
		inv.Add(prefix+"concurrency_key", fmt.Sprintf("must be at most %d characters", maxConcurrencyKey))
	case !utf8.ValidString(k) || strings.ContainsRune(k, 0):
		inv.Add(prefix+"concurrency_key", "must be valid UTF-8 without NUL characters")
	case k != "" && strings.TrimSpace(k) == "":
		// (a key of spaces is a mistake: it would serialise every item of
		// the org that made the same one, unrelated to each other)
		inv.Add(prefix+"concurrency_key", `must not be blank (omit it, or send "", for no key)`)
	}
	if p.KeyLimit < 0 || p.KeyLimit > maxKeyLimit {
		inv.Add(prefix+"key_limit", fmt.Sprintf("must be between 1 and %d", maxKeyLimit))
	} else if p.KeyLimit > 0 && p.ConcurrencyKey == "" {
		inv.Add(prefix+"key_limit", "needs a concurrency_key")
	}
}

func validateRetry(inv *apperr.InvalidError, prefix string, r RetryPolicy) {
	if r.MaxAttempts < 1 || r.MaxAttempts > maxRetryAttempts {
		inv.Add(prefix+"retry.max_attempts", fmt.Sprintf("must be between 1 and %d", maxRetryAttempts))
	}
	if r.InitialBackoffMS < 0 || r.InitialBackoffMS > maxRetryBackoffMS {
		inv.Add(prefix+"retry.initial_backoff_ms", fmt.Sprintf("must be between 0 and %d", maxRetryBackoffMS))
	}
	if math.IsNaN(r.Base) || r.Base != 0 && (r.Base < 1 || r.Base > maxRetryBase) {
		inv.Add(prefix+"retry.base", fmt.Sprintf("must be between 1 and %d", maxRetryBase))
	}
}

func itemField(i int, field string) string { return "[" + strconv.Itoa(i) + "]." + field }

// unprefix turns "[0].pool" back into "pool" for the single-item calls.
func unprefix(err error) error {
	inv, ok := err.(*apperr.InvalidError)
	if !ok {
		return err
	}
	out := &apperr.InvalidError{}
	for _, f := range inv.Fields {
		name := f.Field
		if len(name) > 4 && name[:4] == "[0]." {
			name = name[4:]
		}
		out.Add(name, f.Detail)
	}
	return out
}
