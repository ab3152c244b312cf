// Package streams stores chunked run streams — the token and log output of
// agent runs — and serves them paged and live. A stream is (org, run, name);
// its chunks are byte strings numbered 0, 1, 2 … without gaps however many
// writers append at once, because each append numbers its chunks under the
// stream row's lock in the statement that inserts them. Readers page by
// index, or follow a stream live through a Tail: one shared LISTEN
// connection per process (the Hub) learns of each commit and wakes the
// tails of that stream, which read the new chunks from the table — or, for
// chunks this process appended, take them straight from the append. Closed
// streams are purged after a retention period by a leader-only loop.
package streams

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/leader"
)

// Range is the indexes an append was given, both inclusive.
type Range struct {
	FirstIndex int64 `json:"first_index"`
	LastIndex  int64 `json:"last_index"`
}

// Info is a stream's state. An absent stream (or another org's) is
// {TailIndex: -1, Done: false}.
type Info struct {
	// TailIndex is the index of the last chunk, -1 when there is none.
	TailIndex int64 `json:"tail_index"`
	Done      bool  `json:"done"`
}

// Chunk is one stored chunk.
type Chunk struct {
	Index int64
	Data  []byte
}

// Page is a run of chunks read from a stream.
type Page struct {
	Items []Chunk
	// Next is the next index to read: one past the last item, or the start
	// index when there were none.
	Next int64
	// HasMore reports whether chunks at Next or later are stored now.
	HasMore bool
	// Info is the stream's state in the same snapshot.
	Info Info
}

// NamesPage is a page of a run's stream names.
type NamesPage struct {
	Names []string
	// NextCursor continues the listing; "" at the end.
	NextCursor string
}

// Querier is what an append inside a caller's transaction needs; pgx.Tx
// satisfies it. (The one interface of internal/db, under the name callers
// already use.)
type Querier = db.Querier

// Service is the streams domain: appends, reads, the live-tail hub and
// retention.
type Service struct {
	db       *pgxpool.Pool
	cfg      Config
	metrics  *metrics
	hub      *Hub
	notifier *notifier

	retention leader.Background
}

// New returns a Service on db. Start runs its hub and retention loop.
func New(db *pgxpool.Pool, cfg Config) (*Service, error) {
	if db == nil {
		return nil, errors.New("streams: a database pool is required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("streams config: %w", err)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Service{db: db, cfg: cfg, metrics: m, hub: newHub(db, cfg.Logger, m), notifier: &notifier{db: db, logger: cfg.Logger}}, nil
}

// Config returns the effective configuration (defaults filled in).
func (s *Service) Config() Config { return s.cfg }

// Hub returns the service's live-tail hub.
func (s *Service) Hub() *Hub { return s.hub }

// RetentionLeadership names the retention loop's leadership
// (internal/leader).
const RetentionLeadership = "streams.retention"

// Start starts the hub (it returns once the hub listens) and the
// leader-elected retention loop; both run until Stop or ctx ends. A second
// Start fails: the hub refuses it.
func (s *Service) Start(ctx context.Context) error {
	if err := s.hub.Start(ctx); err != nil {
		return err
	}
	el := &leader.Elector{DB: s.db, Name: RetentionLeadership, Retry: s.cfg.LeaderRetry, Logger: s.cfg.Logger}
	return s.retention.Start(ctx, el, leader.Every(s.cfg.PurgeInterval, s.retentionRound, func(err error) {
		s.metrics.purgeErrs.Inc()
		s.cfg.Logger.Warn("purging expired streams failed", "error", err.Error())
	}))
}

// Stop stops the retention loop and the hub (live tails then end) and
// waits for the notifications of finished appends to be sent. Stopping
// twice, or a service never started, is safe.
func (s *Service) Stop(ctx context.Context) error {
	var errs []error
	if err := s.notifier.wait(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stopping stream notifications: %w", err))
	}
	// (stopped whatever the wait returned: live tails must end for the
	// API's shutdown to finish)
	errs = append(errs, s.retention.Stop(ctx), s.hub.Stop(ctx))
	return errors.Join(errs...)
}

// Append appends chunks to the stream (org, runID, name), creating it on
// first use, atomically: all chunks get consecutive indexes or none is
// stored. A closed stream gives ErrClosed. Live tails learn of the chunks
// once they are durable. The chunks are not retained: the caller may reuse
// them.
func (s *Service) Append(ctx context.Context, org, runID, name string, chunks [][]byte) (Range, error) {
	return s.AppendWithKey(ctx, org, runID, name, "", chunks)
}

// AppendWithKey is Append with an idempotency key (the request's
// Idempotency-Key; "" for none): a key already used on this stream appends
// nothing and returns the indexes its first use got, even once the stream
// is closed. So a retry after a lost response never appends twice. A key
// used on the stream for other chunks gives ErrKeyReused and appends
// nothing.
func (s *Service) AppendWithKey(ctx context.Context, org, runID, name, key string, chunks [][]byte) (Range, error) {
	if err := s.checkAppend(runID, name, chunks); err != nil {
		return Range{}, err
	}
	var r Range
	var stream uuid.UUID
	var err error
	if key == "" {
		if r, stream, err = s.appendTo(ctx, s.db, org, runID, name, chunks, false); err == nil {
			s.metrics.appended(chunks) // (its own statement, committed)
		}
	} else {
		var replayed bool
		if r, stream, replayed, err = s.appendKeyed(ctx, org, runID, name, key, chunks); replayed {
			return r, err
		}
	}
	if err != nil {
		return r, err
	}
	// Committed: this process's tails may have the chunks at once; those
	// elsewhere learn of them from the notification, sent right after. The
	// chunks stand whatever happens to it: its failure is logged, never
	// returned, lest a retry append them twice.
	s.hub.publishOf(stream, org, runID, name, r.FirstIndex, chunks)
	s.notifier.add("a" + strconv.FormatInt(r.LastIndex, 10) + "/" + runID + "/" + name + "/" + org)
	return r, nil
}

// AppendTx is Append inside the caller's transaction (q is a pgx.Tx): the
// chunks become visible, and live tails learn of them, when it commits.
// Concurrent writers of the same stream wait for that commit. The chunks
// are counted in the appended metrics once it commits, where ctx carries
// the transaction's db.WithAfterCommit collector (else not at all: a
// rolled-back append is no append).
func (s *Service) AppendTx(ctx context.Context, q Querier, org, runID, name string, chunks [][]byte) (Range, error) {
	if err := s.checkAppend(runID, name, chunks); err != nil {
		return Range{}, err
	}
	r, _, err := s.appendTo(ctx, q, org, runID, name, chunks, true)
	if err == nil {
		db.AfterCommit(ctx, func() { s.metrics.appended(chunks) })
	}
	return r, err
}

func (s *Service) appendTo(ctx context.Context, q Querier, org, runID, name string, chunks [][]byte, notify bool) (Range, uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Range{}, uuid.Nil, fmt.Errorf("new stream id: %w", err)
	}
	n := int64(len(chunks))
	offsets, total := chunkOffsets(chunks)
	var first int64
	var stream uuid.UUID
	var notified *string
	err = q.QueryRow(ctx, appendSQL, id, org, runID, name, n, nonNil(chunks), notify, total, offsets).Scan(&first, &stream, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return Range{}, uuid.Nil, ErrClosed
	}
	if err != nil {
		return Range{}, uuid.Nil, fmt.Errorf("appending to stream %s/%s: %w", runID, name, err)
	}
	return Range{FirstIndex: first, LastIndex: first + n - 1}, stream, nil
}

// uniqueViolation is Postgres's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

// appendKeyed runs appendKeyedSQL, once more when a concurrent first use of
// the key won the race.
func (s *Service) appendKeyed(ctx context.Context, org, runID, name, key string, chunks [][]byte) (r Range, stream uuid.UUID, replayed bool, err error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Range{}, uuid.Nil, false, fmt.Errorf("new stream id: %w", err)
	}
	offsets, total := chunkOffsets(chunks)
	hash := fingerprint(chunks)
	for attempt := 0; ; attempt++ {
		var firstHash []byte
		var sid *uuid.UUID
		err = s.db.QueryRow(ctx, appendKeyedSQL, id, org, runID, name, int64(len(chunks)), nonNil(chunks), key, total, offsets, hash).
			Scan(&r.FirstIndex, &r.LastIndex, &replayed, &firstHash, &sid)
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return Range{}, uuid.Nil, false, ErrClosed
		case errors.As(err, &pgErr) && pgErr.Code == uniqueViolation && pgErr.ConstraintName == "stream_appends_pkey" && attempt == 0:
			continue
		case err != nil:
			return Range{}, uuid.Nil, false, fmt.Errorf("appending to stream %s/%s: %w", runID, name, err)
		case replayed && firstHash != nil && !bytes.Equal(firstHash, hash):
			// (another caller's key, or one whose HTTP record expired:
			// not a retry of the first append, whose indexes it must not
			// get while its own chunks are dropped)
			return Range{}, uuid.Nil, true, ErrKeyReused
		}
		if !replayed {
			s.metrics.appended(chunks)
		}
		if sid != nil {
			stream = *sid
		}
		return r, stream, replayed, nil
	}
}

// fingerprint identifies an append's chunks, boundaries included: a
// SHA-256 over each chunk's length and bytes.
func fingerprint(chunks [][]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, c := range chunks {
		binary.BigEndian.PutUint64(n[:], uint64(len(c)))
		h.Write(n[:])
		h.Write(c)
	}
	return h.Sum(nil)
}

// nonNil is chunks with each nil chunk an empty one (a copy when there is
// one): pgx sends a nil []byte as NULL, which a chunk's data refuses.
func nonNil(chunks [][]byte) [][]byte {
	if !slices.ContainsFunc(chunks, func(c []byte) bool { return c == nil }) {
		return chunks
	}
	out := slices.Clone(chunks)
	for i, c := range out {
		if c == nil {
			out[i] = []byte{}
		}
	}
	return out
}

func chunkOffsets(chunks [][]byte) (offsets []int64, total int64) {
	offsets = make([]int64, len(chunks))
	for i, c := range chunks {
		offsets[i] = total
		total += int64(len(c))
	}
	return offsets, total
}

func (s *Service) checkAppend(runID, name string, chunks [][]byte) error {
	if err := validateKey(runID, name); err != nil {
		return err
	}
	if len(chunks) == 0 {
		return apperr.Invalid("chunks", "must hold at least one chunk")
	}
	if len(chunks) > s.cfg.MaxChunksPerRequest {
		return &TooManyChunksError{Limit: s.cfg.MaxChunksPerRequest}
	}
	var total int64
	for i, c := range chunks {
		if int64(len(c)) > s.cfg.MaxChunk {
			return &TooLargeError{What: fmt.Sprintf("chunks[%d]", i), Limit: s.cfg.MaxChunk}
		}
		total += int64(len(c))
	}
	if total > s.cfg.MaxRequest {
		return &TooLargeError{What: "chunks", Limit: s.cfg.MaxRequest}
	}
	return nil
}

// TooLargeError reports a chunk or an append over its size limit.
type TooLargeError struct {
	What  string // "chunks[3]" or "chunks" (all of them)
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s exceeds the limit of %d bytes", e.What, e.Limit)
}

// TooManyChunksError reports an append of more than MaxChunksPerRequest
// chunks.
type TooManyChunksError struct {
	Limit int
}

func (e *TooManyChunksError) Error() string {
	return fmt.Sprintf("chunks exceeds the limit of %d chunks per append", e.Limit)
}

// Close marks the stream done, creating it empty when absent. Closing a
// closed stream changes nothing.
func (s *Service) Close(ctx context.Context, org, runID, name string) error {
	if err := validateKey(runID, name); err != nil {
		return err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return fmt.Errorf("new stream id: %w", err)
	}
	var notified string
	err = s.db.QueryRow(ctx, closeSQL, id, org, runID, name).Scan(&notified)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) { // no row: it was closed already
		return fmt.Errorf("closing stream %s/%s: %w", runID, name, err)
	}
	return nil
}

// Info returns the stream's tail index and state.
func (s *Service) Info(ctx context.Context, org, runID, name string) (Info, error) {
	if err := validateKey(runID, name); err != nil {
		return Info{}, err
	}
	var count int64
	var done bool
	err := s.db.QueryRow(ctx, infoSQL, org, runID, name).Scan(&count, &done)
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{TailIndex: -1}, nil
	}
	if err != nil {
		return Info{}, fmt.Errorf("reading stream %s/%s: %w", runID, name, err)
	}
	return Info{TailIndex: count - 1, Done: done}, nil
}

// ListNames pages the names of a run's streams in byte order. cursor is a
// NextCursor from the previous page ("" for the first); limit is at least 1.
func (s *Service) ListNames(ctx context.Context, org, runID, cursor string, limit int) (NamesPage, error) {
	if err := validateRun(runID); err != nil {
		return NamesPage{}, err
	}
	if limit < 1 {
		return NamesPage{}, apperr.Invalid("limit", "must be at least 1")
	}
	rows, err := s.db.Query(ctx, listNamesSQL, org, runID, cursor, limit+1)
	if err != nil {
		return NamesPage{}, fmt.Errorf("listing streams of run %s: %w", runID, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return NamesPage{}, fmt.Errorf("listing streams of run %s: %w", runID, err)
	}
	page := NamesPage{Names: names}
	if len(names) > limit {
		page.Names = names[:limit]
		page.NextCursor = names[limit-1]
	}
	return page, nil
}

// MaxIndex is the largest chunk index a read may start from: 2^53−1, the
// largest integer every JSON client reads exactly (and far from overflow
// when a page's bounds are added to it).
const MaxIndex = 1<<53 - 1

// Chunks reads up to limit chunks from index start (fewer when they would
// exceed MaxRequest bytes in all; never none while one is stored there).
func (s *Service) Chunks(ctx context.Context, org, runID, name string, start int64, limit int) (Page, error) {
	if err := validateKey(runID, name); err != nil {
		return Page{}, err
	}
	if start < 0 || start > MaxIndex {
		return Page{}, apperr.Invalid("start_index", fmt.Sprintf("must be a chunk index from 0 to %d", MaxIndex))
	}
	if limit < 1 {
		return Page{}, apperr.Invalid("limit", "must be at least 1")
	}
	page, _, err := s.read(ctx, org, runID, name, start, limit)
	return page, err
}

// read is Chunks without the checks; it also returns the stream row's id
// (uuid.Nil when absent): a stream purged and written again under its name
// is another stream.
func (s *Service) read(ctx context.Context, org, runID, name string, start int64, limit int) (Page, uuid.UUID, error) {
	var stream uuid.UUID
	rows, err := s.db.Query(ctx, readSQL, org, runID, name, start, limit, s.cfg.MaxRequest)
	if err != nil {
		return Page{}, uuid.Nil, fmt.Errorf("reading stream %s/%s: %w", runID, name, err)
	}
	defer rows.Close()
	page := Page{Next: start, Info: Info{TailIndex: -1}}
	for rows.Next() {
		var count int64
		var idx *int64
		var data []byte
		if err := rows.Scan(&count, &page.Info.Done, &idx, &data, &stream); err != nil {
			return Page{}, uuid.Nil, fmt.Errorf("reading stream %s/%s: %w", runID, name, err)
		}
		page.Info.TailIndex = count - 1
		if idx != nil && *idx == page.Next {
			page.Items = append(page.Items, Chunk{Index: *idx, Data: data})
			page.Next = *idx + 1
		} else if idx != nil {
			// A hole: retention is purging this closed stream, in batches
			// that follow the heap, not the indexes. The page stops before
			// it; a page that starts at the hole reads nothing and goes on
			// past it (next cursor beyond the start: the reader sees the
			// chunks in between are gone).
			if len(page.Items) == 0 {
				page.Next = *idx
			}
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Page{}, uuid.Nil, fmt.Errorf("reading stream %s/%s: %w", runID, name, err)
	}
	if len(page.Items) == 0 && page.Next == start && page.Info.TailIndex >= start {
		// Nothing stored from start to the window's end, though the row
		// counts chunks there: purged. The next page starts past the
		// window (never at start again: a reader would loop on it).
		page.Next = min(start+int64(limit), page.Info.TailIndex+1)
	}
	page.HasMore = page.Info.TailIndex >= page.Next
	return page, stream, nil
}
