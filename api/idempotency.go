package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/jsonb"
)

// DefaultIdempotencyRetention is how long a first response is replayed
// unless Config.IdempotencyRetention says otherwise.
const DefaultIdempotencyRetention = 24 * time.Hour

const (
	// idempotencyRunLimit bounds the first request under a key: its handler
	// runs under this deadline, so a claim older than it plus the time its
	// record may take to write (idempotencyRecordLimit) has no live request
	// behind it.
	idempotencyRunLimit    = 30 * time.Second
	idempotencyRecordLimit = 10 * time.Second
	// idempotencyAbandoned is when an in-flight claim is considered dead (its
	// replica crashed mid-request) and a retry may take it over.
	idempotencyAbandoned = idempotencyRunLimit + idempotencyRecordLimit + 5*time.Second
	// idempotencyWait bounds how long a concurrent duplicate waits for the
	// first request to finish. It outlasts idempotencyAbandoned, so a retry
	// behind a crashed replica's claim takes it over within one wait
	// instead of being told 409.
	idempotencyWait   = 60 * time.Second
	maxIdempotencyKey = 255
	// fingerprintJSONLimit: bodies up to this size are compared as JSON
	// values under a key, longer ones byte for byte (requestFingerprint).
	fingerprintJSONLimit = 64 << 10
)

// IdempotencyKey returns the request's Idempotency-Key header ("" when
// absent). Handlers pass it to their domain call as its own idempotency key.
func IdempotencyKey(c echo.Context) string { return c.Request().Header.Get("Idempotency-Key") }

// idempotencyScope is the route part of a key's scope: the caller's own
// (its sub, and its agent for a token bound to one), not the org's. The
// replay runs before the handler, and a response is an answer to a caller:
// in an org-wide scope one approver sending another's key would be replayed
// the other's 403 (self-approval) instead of deciding, and one agent
// another agent's data or a success the handler would refuse it. In its
// own scope a caller gets what it would get without the key. Domain keys
// (spends, wake-ups, work, tool calls) still dedupe the act itself across
// callers. Routes start with a method, so the "agent"/"sub" prefixes cannot
// collide with a route, and the quoted ids end unambiguously.
func idempotencyScope(c echo.Context) string {
	scope := c.Request().Method + " " + c.Request().URL.Path
	p := PrincipalFrom(c)
	if p.Sub != "" {
		scope = "sub " + strconv.Quote(p.Sub) + " " + scope
	}
	if p.AgentID != "" {
		scope = "agent " + strconv.Quote(p.AgentID) + " " + scope
	}
	if len(scope) > maxStoredScope {
		// (the path is the client's to choose, and the claim is written
		// before the handler checks it: a long one would exceed the
		// primary key's btree row limit and fail the request with a 500)
		sum := sha256.Sum256([]byte(scope))
		scope = "sha256 " + hex.EncodeToString(sum[:])
	}
	return scope
}

// maxStoredScope is the longest scope stored as it is; a longer one is
// stored as its SHA-256 ("sha256 " cannot begin a method, "sub" or "agent").
const maxStoredScope = 1024

// idempotencyStore keeps first responses per (org, caller, route, key): the
// caller is the token's sub and, for a bound token, its agent
// (idempotencyScope). Records past retention are taken over here and
// purged by internal/retention, whose one leader-only loop purges every
// table's old rows.
type idempotencyStore struct {
	db        *pgxpool.Pool
	logger    *slog.Logger
	retention time.Duration // how long a first response is replayed
}

// middleware replays the first response to a repeated (org, route, key),
// makes concurrent duplicates wait for the first, and answers 422 when the
// same key comes with a different body. Server errors, 429s, malformed
// requests (400, 413, 415) and requests whose client left (499) are not
// kept, so a retry after any of them runs again.
func (s *idempotencyStore) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		key := IdempotencyKey(c)
		if key == "" {
			return next(c)
		}
		if len(key) > maxIdempotencyKey {
			return Invalid("Idempotency-Key", "must be at most 255 bytes")
		}
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return readError(err)
		}
		c.Request().Body = io.NopCloser(bytes.NewReader(body))
		fp := fingerprintRequest(c.Request().Header.Get(echo.HeaderContentType), body)
		org, route := PrincipalFrom(c).OrgID, idempotencyScope(c)
		ctx := c.Request().Context()

		deadline := time.Now().Add(idempotencyWait)
		for {
			rec, claimed, err := s.claim(ctx, org, route, key, fp)
			if err != nil {
				return err
			}
			if claimed && ctx.Err() != nil {
				// The client left while the claim was written: give the
				// key back, as after any request whose client left.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), idempotencyRecordLimit)
				s.release(rctx, org, route, key, rec.claimedAt)
				cancel()
				return ctx.Err()
			}
			if claimed {
				return s.runFirst(c, next, org, route, key, rec.claimedAt)
			}
			if !fp.matches(rec.fingerprint) {
				return NewProblem(http.StatusUnprocessableEntity, "idempotency-key-reused",
					"this Idempotency-Key was used with a different request body")
			}
			if rec.status != 0 {
				c.Response().Header().Set("Idempotent-Replayed", "true")
				return c.Blob(rec.status, rec.contentType, rec.body)
			}
			if time.Now().After(deadline) {
				return NewProblem(http.StatusConflict, "idempotency-key-in-flight",
					"a request with this Idempotency-Key is still being processed; retry later")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(25 * time.Millisecond):
			}
		}
	}
}

// requestFingerprint is what the requests under one key must share: the
// SHA-256 of the raw body, and, for a JSON body (by its Content-Type), of
// the body as a JSON value — object keys sorted, whitespace dropped,
// strings and numbers as they decode (numbers as written, so 1 and 1.0
// differ) — so that a retry which spells the same JSON differently (a
// client that re-serialises its request, in another key order) is the same
// request. Two requests match when their raw hashes do, or both have the
// same value hash. Without a value hash (jsonHash nil) the body counts
// byte for byte: a body that is not JSON or not sent as JSON (a stream
// append's raw bytes), longer than fingerprintJSONLimit (decoding would
// cost more than the hash), not UTF-8, or with a key given twice in an
// object or keys that differ only in case (the handlers refuse both, so
// such a body never matches a kept request by its value).
type requestFingerprint struct {
	raw, jsonHash []byte
}

func fingerprintRequest(contentType string, body []byte) requestFingerprint {
	raw := sha256.Sum256(body)
	fp := requestFingerprint{raw: raw[:]}
	// (no Content-Type: the handlers read the body as JSON, readJSONBody,
	// so a retry re-serialised is the same request)
	if media, _, err := mime.ParseMediaType(contentType); contentType != "" && (err != nil ||
		(media != echo.MIMEApplicationJSON && !strings.HasSuffix(media, "+json"))) {
		return fp
	}
	if len(body) > fingerprintJSONLimit || !utf8.Valid(body) {
		return fp
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || !restIsSpace(dec, body) || hasCaseFoldedKeys(v) {
		return fp
	}
	if _, _, repeated := misnamedKey(body, nil); repeated {
		return fp
	}
	if !jsonb.Storable(body) {
		// (a body Postgres cannot store, which the handlers refuse: an
		// unpaired surrogate escape decodes to U+FFFD as "\ufffd" does, and
		// compared by value it was replayed another body's answer)
		return fp
	}
	canonical, err := json.Marshal(v)
	if err != nil {
		return fp
	}
	sum := sha256.Sum256(canonical)
	fp.jsonHash = sum[:]
	return fp
}

// matches says whether a request with fingerprint fp is the one that
// wrote rec.
func (fp requestFingerprint) matches(rec requestFingerprint) bool {
	return bytes.Equal(fp.raw, rec.raw) || fp.jsonHash != nil && bytes.Equal(fp.jsonHash, rec.jsonHash)
}

// stored is what request_json_hash holds for fp: the value's hash after
// the raw body's, so that it is trusted only beside that raw hash — a
// replica of an earlier version that takes a record over rewrites
// request_hash but not this column (migration 00020). Nil without a value
// hash.
func (fp requestFingerprint) stored() []byte {
	if fp.jsonHash == nil {
		return nil
	}
	return slices.Concat(fp.raw, fp.jsonHash)
}

// loadValueHash sets fp's value hash from request_json_hash as stored
// wrote it, unless it was written beside another raw hash than fp's.
func (fp *requestFingerprint) loadValueHash(stored []byte) {
	if len(stored) == 2*sha256.Size && bytes.Equal(stored[:sha256.Size], fp.raw) {
		fp.jsonHash = stored[sha256.Size:]
	}
}

// hasCaseFoldedKeys says whether some object in v has two keys equal under
// Unicode case folding (as encoding/json matches a struct's fields).
func hasCaseFoldedKeys(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		seen := make(map[string]bool, len(v))
		for k, e := range v {
			f := foldKey(k)
			if seen[f] || hasCaseFoldedKeys(e) {
				return true
			}
			seen[f] = true
		}
	case []any:
		for _, e := range v {
			if hasCaseFoldedKeys(e) {
				return true
			}
		}
	}
	return false
}

// foldKey maps each rune of s to the least of its simple case folds, so
// that strings.EqualFold(a, b) exactly when foldKey(a) == foldKey(b).
func foldKey(s string) string {
	var b strings.Builder
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

type idempotencyRecord struct {
	fingerprint requestFingerprint
	status      int
	contentType string
	body        []byte
	claimedAt   time.Time // of the claim this request made (its fence)
}

// claim inserts an in-flight record for the key, or takes over one that is
// expired (its answer recorded longer than the retention ago: counted from
// the claim, a request still running past a short retention had its key
// taken over by a duplicate, which ran the handler again) or abandoned;
// otherwise it returns the existing record. A claim's
// created_at fences it: a request whose abandoned claim was taken over
// writes nothing when it finally ends.
func (s *idempotencyStore) claim(ctx context.Context, org, route, key string, fp requestFingerprint) (idempotencyRecord, bool, error) {
	var claimedAt time.Time
	// Not canceled when the client leaves: a claim cut off mid-statement may
	// commit all the same, unreleased (its request never knew it claimed),
	// and every retry under the key then waited for it to be abandoned
	// (idempotencyAbandoned, 45 s) — longer than many a client's deadline.
	// The caller releases a claim its client left.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), idempotencyRecordLimit)
	defer cancel()
	err := s.db.QueryRow(cctx, `
		INSERT INTO idempotency_keys (org_id, route, key, request_hash, request_json_hash)
		VALUES ($1, $2, $3, $4, $7)
		ON CONFLICT (org_id, route, key) DO UPDATE
		   SET request_hash = EXCLUDED.request_hash, request_json_hash = EXCLUDED.request_json_hash, created_at = now(),
		       status_code = NULL, content_type = NULL, response_body = NULL, completed_at = NULL
		 WHERE idempotency_keys.completed_at < now() - $5::interval
		    OR (idempotency_keys.completed_at IS NULL AND idempotency_keys.created_at < now() - $6::interval)
		RETURNING created_at`,
		org, route, key, fp.raw, s.retention, idempotencyAbandoned, fp.stored()).Scan(&claimedAt)
	switch {
	case err == nil:
		return idempotencyRecord{claimedAt: claimedAt}, true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return idempotencyRecord{}, false, err
	}
	var rec idempotencyRecord
	var valueHash []byte
	var status *int32
	var ct *string
	err = s.db.QueryRow(ctx, `
		SELECT request_hash, request_json_hash, status_code, content_type, response_body
		  FROM idempotency_keys WHERE org_id = $1 AND route = $2 AND key = $3`,
		org, route, key).Scan(&rec.fingerprint.raw, &valueHash, &status, &ct, &rec.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.claim(ctx, org, route, key, fp) // deleted after a 5xx: try again
	}
	if err != nil {
		return rec, false, err
	}
	rec.fingerprint.loadValueHash(valueHash)
	if status != nil {
		rec.status = int(*status)
	}
	if ct != nil {
		rec.contentType = *ct
	}
	return rec, false, nil
}

// runFirst runs the handler for the request that claimed the key and keeps
// its response.
func (s *idempotencyStore) runFirst(c echo.Context, next echo.HandlerFunc, org, route, key string, claimedAt time.Time) error {
	rec := &recorder{ResponseWriter: c.Response().Writer}
	c.Response().Writer = rec
	req := c.Request()
	runCtx, cancelRun := context.WithTimeout(req.Context(), idempotencyRunLimit)
	defer cancelRun()
	c.SetRequest(req.WithContext(runCtx))
	defer func() {
		// A handler that panics is answered 500 by the recover middleware
		// above this one, which is never kept: give the key back, as after
		// any other 5xx, rather than leave a retry waiting for the claim to
		// be abandoned.
		if r := recover(); r != nil {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), idempotencyRecordLimit)
			defer cancel()
			s.release(ctx, org, route, key, claimedAt)
			panic(r)
		}
	}()
	err := next(c)
	if err != nil {
		c.Error(err) // write the problem now, so it is recorded
	}
	// The request context may be canceled by now; the record must be written.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), idempotencyRecordLimit)
	defer cancel()
	status := c.Response().Status
	if !keptUnderKey(status) || !c.Response().Committed {
		s.release(ctx, org, route, key, claimedAt)
		return nil
	}
	tag, dbErr := s.db.Exec(ctx, `
		UPDATE idempotency_keys SET status_code = $4, content_type = $5, response_body = $6, completed_at = now()
		 WHERE org_id = $1 AND route = $2 AND key = $3 AND created_at = $7`,
		org, route, key, status, c.Response().Header().Get(echo.HeaderContentType), rec.buf.Bytes(), claimedAt)
	if dbErr == nil && tag.RowsAffected() == 0 {
		s.logger.Warn("a request outlived its Idempotency-Key claim, which another request took over; its response is not kept",
			"org_id", org, "route", route, "idempotency_key", key)
	}
	return dbErr
}

// release gives back a key whose response is not kept, so that a retry
// runs at once (best effort: a claim left behind is taken over once
// abandoned).
func (s *idempotencyStore) release(ctx context.Context, org, route, key string, claimedAt time.Time) {
	_, _ = s.db.Exec(ctx, `DELETE FROM idempotency_keys WHERE org_id = $1 AND route = $2 AND key = $3 AND created_at = $4`,
		org, route, key, claimedAt)
}

// keptUnderKey reports whether a response is replayed to a retry. Not kept:
// a 5xx (the retry may succeed), a 429 (it says "retry later": replaying it
// would refuse the retry it asks for), a 499 (the client left before its
// answer: there is none to replay), and a 400, 413 or 415 — a malformed
// request (its input, its size, its Content-Type), refused before anything
// was done — so a corrected retry under the same key runs instead of being
// replayed the refusal (a corrected Content-Type leaves the body's hash as
// it was) or meeting "key used with a different body".
func keptUnderKey(status int) bool {
	switch {
	case status >= 500, status == http.StatusTooManyRequests, status == statusClientClosedRequest,
		status == http.StatusBadRequest, status == http.StatusRequestEntityTooLarge, status == http.StatusUnsupportedMediaType:
		return false
	}
	return true
}

// recorder tees the response body into a buffer.
type recorder struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.buf.Write(b)
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
