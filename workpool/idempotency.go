package workpool

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// maxIdempotencyKey bounds an enqueue's idempotency key (bytes), as the
// HTTP layer bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

// keyRetention is how long idempotency keys are kept: at least
// IdempotencyRetention, and as long as finished work records when that is
// longer.
func (m *Manager) keyRetention() time.Duration {
	return max(IdempotencyRetention, m.cfg.WorkRetention)
}

// requestHash fingerprints what an enqueue asks for, so that a repeated
// idempotency key tells a retry of the same request from a different one.
// JSON values count by content (key order and spacing aside), and an
// omitted timeout, backoff base or key limit as its default; an omitted
// retry policy differs from an explicit one.
func requestHash(p EnqueueParams) []byte {
	type onComplete struct {
		Hook    string          `json:"hook"`
		Context json.RawMessage `json:"context"`
	}
	canon := struct {
		Handler        string          `json:"handler"`
		Args           json.RawMessage `json:"args"`
		RunAt          *time.Time      `json:"run_at"`
		Retry          *RetryPolicy    `json:"retry"`
		TimeoutMS      int             `json:"timeout_ms"`
		OnComplete     *onComplete     `json:"on_complete"`
		ConcurrencyKey string          `json:"concurrency_key"`
		KeyLimit       int             `json:"key_limit"`
	}{
		Handler: p.Handler, Args: canonicalJSON(p.Args, "{}"), TimeoutMS: cmp.Or(p.TimeoutMS, DefaultTimeoutMS),
		ConcurrencyKey: p.ConcurrencyKey, KeyLimit: p.KeyLimit,
	}
	if canon.KeyLimit == 1 {
		// 0 means 1; spelled 0, so that a key stored before this spelling
		// of the default still matches a retry that leaves it out (one
		// stored with an explicit 1 does not match its retry: a one-off,
		// for the keys of the upgrade's retention window)
		canon.KeyLimit = 0
	}
	if !p.RunAt.IsZero() || p.RunAtSet {
		at := p.RunAt.UTC()
		canon.RunAt = &at
	}
	if p.Retry != nil {
		r := *p.Retry
		r.Base = cmp.Or(r.Base, 2)
		canon.Retry = &r
	}
	if p.OnComplete != nil {
		canon.OnComplete = &onComplete{Hook: p.OnComplete.Hook, Context: canonicalJSON(p.OnComplete.Context, "null")}
	}
	b, err := json.Marshal(canon)
	if err != nil {
		// Every part is valid JSON by now (validate ran first).
		panic(fmt.Sprintf("workpool: fingerprinting a request: %v", err))
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// canonicalJSON re-encodes valid JSON with sorted keys and no spacing,
// keeping numbers as written; empty input is def.
func canonicalJSON(raw json.RawMessage, def string) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage(def)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// claimKeys records the idempotency keys of a batch in tx. An item whose
// key was recorded before — or by a concurrent enqueue, which this one
// waits for — is a replay: it takes the first enqueue's work id and
// inserts nothing; under a different request it is
// ErrIdempotencyKeyReused. It returns how many items remain to insert.
func (m *Manager) claimKeys(ctx context.Context, tx pgx.Tx, r *enqueueRows) (int, error) {
	var keyed []int
	for i, k := range r.idemKeys {
		if k != nil {
			keyed = append(keyed, i)
		}
	}
	// One order for every batch, so that two batches waiting for each
	// other's keys cannot deadlock.
	slices.SortFunc(keyed, func(a, b int) int {
		return cmp.Or(cmp.Compare(r.orgs[a], r.orgs[b]), cmp.Compare(r.pools[a], r.pools[b]), cmp.Compare(*r.idemKeys[a], *r.idemKeys[b]))
	})
	replays := 0
	// A key seen as taken can be purged before it is read (it was past
	// retention): the second pass claims it afresh.
	for pass := 0; len(keyed) > 0; pass++ {
		if pass == 2 {
			return 0, fmt.Errorf("enqueueing: idempotency keys kept changing while being claimed")
		}
		taken, err := m.insertKeys(ctx, tx, r, keyed)
		if err != nil {
			return 0, err
		}
		if len(taken) == 0 {
			break
		}
		known, err := m.readKeys(ctx, tx, r, taken)
		if err != nil {
			return 0, err
		}
		keyed = keyed[:0]
		for _, i := range taken {
			k, ok := known[keyOf(r, i)]
			switch {
			case !ok:
				keyed = append(keyed, i)
			case !bytes.Equal(k.hash, r.hashes[i]):
				return 0, fmt.Errorf("pool %s, key %q: %w", r.pools[i], *r.idemKeys[i], ErrIdempotencyKeyReused)
			default:
				r.ids[i], r.replay[i] = k.workID, true
				replays++
			}
		}
	}
	return len(r.ids) - replays, nil
}

type idemKey struct{ org, pool, key string }

func keyOf(r *enqueueRows, i int) idemKey { return idemKey{r.orgs[i], r.pools[i], *r.idemKeys[i]} }

// insertKeys inserts the keys of items; it returns the items whose keys
// were already taken.
func (m *Manager) insertKeys(ctx context.Context, tx pgx.Tx, r *enqueueRows, items []int) ([]int, error) {
	orgs, pools, keys, hashes, ids := make([]string, len(items)), make([]string, len(items)), make([]string, len(items)),
		make([][]byte, len(items)), make([]uuid.UUID, len(items))
	for j, i := range items {
		orgs[j], pools[j], keys[j], hashes[j], ids[j] = r.orgs[i], r.pools[i], *r.idemKeys[i], r.hashes[i], r.ids[i]
	}
	rows, err := tx.Query(ctx, sqlClaimKeys, orgs, pools, keys, hashes, pgUUIDs(ids), m.now())
	if err != nil {
		return nil, fmt.Errorf("recording idempotency keys: %w", err)
	}
	claimed := map[idemKey]bool{}
	for rows.Next() {
		var k idemKey
		if err := rows.Scan(&k.org, &k.pool, &k.key); err != nil {
			rows.Close()
			return nil, fmt.Errorf("recording idempotency keys: %w", err)
		}
		claimed[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recording idempotency keys: %w", err)
	}
	var taken []int
	for _, i := range items {
		if !claimed[keyOf(r, i)] {
			taken = append(taken, i)
		}
	}
	return taken, nil
}

type knownKey struct {
	hash   []byte
	workID uuid.UUID
}

// readKeys reads the recorded keys of items.
func (m *Manager) readKeys(ctx context.Context, tx pgx.Tx, r *enqueueRows, items []int) (map[idemKey]knownKey, error) {
	orgs, pools, keys := make([]string, len(items)), make([]string, len(items)), make([]string, len(items))
	for j, i := range items {
		orgs[j], pools[j], keys[j] = r.orgs[i], r.pools[i], *r.idemKeys[i]
	}
	rows, err := tx.Query(ctx, sqlReadKeys, orgs, pools, keys)
	if err != nil {
		return nil, fmt.Errorf("reading idempotency keys: %w", err)
	}
	known := map[idemKey]knownKey{}
	for rows.Next() {
		var (
			k  idemKey
			kk knownKey
		)
		if err := rows.Scan(&k.org, &k.pool, &k.key, &kk.hash, &kk.workID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading idempotency keys: %w", err)
		}
		known[k] = kk
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading idempotency keys: %w", err)
	}
	return known, nil
}

// purgeKeys deletes idempotency keys past retention in bounded batches.
func (l *loop) purgeKeys(ctx context.Context) (int64, error) {
	return l.purgeBatches(ctx, sqlPurgeKeys, l.m.now().Add(-l.m.keyRetention()), "idempotency keys")
}
