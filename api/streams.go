package api

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/streams"
)

// Stream routes (SPEC §8). Writers are agents; readers agents or approvers.
const (
	streamPath       = "/v1/runs/:run_id/streams/:name"
	streamChunksPath = streamPath + "/chunks"
)

// streamRoutes registers the stream routes when the streams service is
// configured. The chunk append has its own body limit (MaxRequest).
func (s *Server) streamRoutes() {
	if s.svc.Streams == nil {
		return
	}
	readers := []string{RoleAgent, RoleApprover}
	s.route(http.MethodPost, streamChunksPath, s.appendStreamChunks, []string{RoleAgent}, s.idempotent())
	s.setBodyLimit(streamChunksPath, s.svc.Streams.Config().MaxRequest)
	s.route(http.MethodPost, streamPath+"/close", s.closeStream, []string{RoleAgent}, s.idempotent())
	s.route(http.MethodGet, "/v1/runs/:run_id/streams", s.listStreams, readers)
	s.route(http.MethodGet, streamPath, s.getStream, readers)
	s.route(http.MethodGet, streamChunksPath, s.listStreamChunks, readers)
	s.route(http.MethodGet, streamPath+"/sse", s.streamEvents, readers)
}

// streamChunkIn is one chunk of a JSON append.
type streamChunkIn struct {
	DataBase64 *string `json:"data_base64" required:"true"`
}

type streamAppendIn struct {
	Chunks []streamChunkIn `json:"chunks" required:"true"`
}

type streamChunkOut struct {
	Index      int64  `json:"index"`
	DataBase64 string `json:"data_base64"`
}

type streamChunksOut struct {
	Items      []streamChunkOut `json:"items"`
	NextCursor string           `json:"next_cursor"`
	HasMore    bool             `json:"has_more"`
}

type streamNamesOut struct {
	Items      []string `json:"items"`
	NextCursor *string  `json:"next_cursor"`
}

// appendStreamChunks takes a raw application/octet-stream body as one chunk
// or JSON {chunks: [{data_base64}]} as many, appended atomically.
func (s *Server) appendStreamChunks(c echo.Context) error {
	runID, name, err := streamParams(c)
	if err != nil {
		return err
	}
	mt, _, _ := mime.ParseMediaType(c.Request().Header.Get(echo.HeaderContentType))
	var chunks [][]byte
	switch {
	case mt == echo.MIMEOctetStream:
		chunks, err = s.octetChunk(c)
	case mt == echo.MIMEApplicationJSON || strings.HasSuffix(mt, "+json"):
		chunks, err = s.jsonChunks(c)
	default:
		return unsupportedMediaType("send one chunk as application/octet-stream or many as application/json {chunks: [{data_base64}]}")
	}
	if err != nil {
		return err
	}
	// The Idempotency-Key also keys the append itself, so a retry whose
	// first attempt committed but lost its response appends nothing.
	r, err := s.svc.Streams.AppendWithKey(c.Request().Context(), PrincipalFrom(c).OrgID, runID, name, IdempotencyKey(c), chunks)
	if err != nil {
		return streamProblem(err)
	}
	return c.JSON(http.StatusCreated, r)
}

func (s *Server) octetChunk(c echo.Context) ([][]byte, error) {
	limit := s.svc.Streams.Config().MaxChunk
	// Read one byte past the chunk limit to tell "at the limit" from "over".
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, limit+1))
	if err != nil {
		return nil, readError(err)
	}
	if int64(len(body)) > limit {
		return nil, tooLargeProblem("chunk-too-large", "body", fmt.Sprintf("a chunk may hold at most %d bytes", limit))
	}
	return [][]byte{body}, nil
}

func (s *Server) jsonChunks(c echo.Context) ([][]byte, error) {
	body, err := readJSONBody(c)
	if err != nil {
		return nil, err
	}
	return decodeStreamChunks(body, s.svc.Streams.Config().MaxChunksPerRequest)
}

// decodeStreamChunks decodes a JSON append {chunks: [{data_base64}]} of 1 to
// maxChunks chunks. The count is checked before any chunk is decoded.
func decodeStreamChunks(body []byte, maxChunks int) ([][]byte, error) {
	var in streamAppendIn
	if err := decodeJSON(body, &in); err != nil {
		return nil, err
	}
	if len(in.Chunks) == 0 {
		return nil, Invalid("chunks", "must hold at least one chunk")
	}
	if len(in.Chunks) > maxChunks {
		return nil, streamProblem(&streams.TooManyChunksError{Limit: maxChunks})
	}
	chunks := make([][]byte, len(in.Chunks))
	for i, ch := range in.Chunks {
		field := fmt.Sprintf("chunks[%d].data_base64", i)
		if ch.DataBase64 == nil {
			return nil, Invalid(field, "is required")
		}
		// (Go's decoder skips line breaks; the contract's base64 has none)
		data, err := base64.StdEncoding.DecodeString(*ch.DataBase64)
		if err != nil || strings.ContainsAny(*ch.DataBase64, "\r\n") {
			return nil, Invalid(field, "must be standard base64 (RFC 4648, padded)")
		}
		chunks[i] = data
	}
	return chunks, nil
}

func (s *Server) closeStream(c echo.Context) error {
	runID, name, err := streamParams(c)
	if err != nil {
		return err
	}
	if err := s.svc.Streams.Close(c.Request().Context(), PrincipalFrom(c).OrgID, runID, name); err != nil {
		return streamProblem(err)
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) getStream(c echo.Context) error {
	runID, name, err := streamParams(c)
	if err != nil {
		return err
	}
	info, err := s.svc.Streams.Info(c.Request().Context(), PrincipalFrom(c).OrgID, runID, name)
	if err != nil {
		return streamProblem(err)
	}
	return c.JSON(http.StatusOK, info)
}

// listStreams pages a run's stream names; the cursor is the last name seen,
// base64url-encoded so that clients treat it as opaque.
func (s *Server) listStreams(c echo.Context) error {
	runID, err := streamPathParam(c, "run_id")
	if err != nil {
		return err
	}
	limit, err := listLimit(c)
	if err != nil {
		return err
	}
	after, err := streamNameCursor(c.QueryParam("cursor"))
	if err != nil {
		return err
	}
	page, err := s.svc.Streams.ListNames(c.Request().Context(), PrincipalFrom(c).OrgID, runID, after, limit)
	if err != nil {
		return streamProblem(err)
	}
	out := streamNamesOut{Items: page.Names}
	if out.Items == nil {
		out.Items = []string{}
	}
	if page.NextCursor != "" {
		next := base64.RawURLEncoding.EncodeToString([]byte(page.NextCursor))
		out.NextCursor = &next
	}
	return c.JSON(http.StatusOK, out)
}

// streamNameCursor decodes a listStreams cursor ("" for none) into the name
// to list after. Every cursor this API returns encodes a stream name, so
// one that decodes to anything a name cannot be (streams.ValidateID: bytes
// that are not UTF-8, NUL or another unprintable character, a "/", more
// than MaxIDLength characters) was not returned by it: 400, as a cursor
// that is not base64url — not bytes handed to Postgres, which refuses
// invalid UTF-8 and NUL in text (a 500).
func streamNameCursor(raw string) (string, error) {
	after, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil || len(after) > 0 && streams.ValidateID("cursor", string(after)) != nil {
		return "", Invalid("cursor", "is not a cursor this API returned")
	}
	return string(after), nil
}

// listStreamChunks pages chunks from ?cursor= or ?start_index= (an index
// either way: the cursor is always the next index to read).
func (s *Server) listStreamChunks(c echo.Context) error {
	runID, name, err := streamParams(c)
	if err != nil {
		return err
	}
	limit, err := listLimit(c)
	if err != nil {
		return err
	}
	cursor, start := c.QueryParam("cursor"), c.QueryParam("start_index")
	if cursor != "" && start != "" {
		return Invalid("start_index", "give cursor or start_index, not both")
	}
	from, err := streamIndex("cursor", cursor)
	if err == nil && start != "" {
		from, err = streamIndex("start_index", start)
	}
	if err != nil {
		return err
	}
	page, err := s.svc.Streams.Chunks(c.Request().Context(), PrincipalFrom(c).OrgID, runID, name, from, limit)
	if err != nil {
		return streamProblem(err)
	}
	out := streamChunksOut{Items: make([]streamChunkOut, len(page.Items)), NextCursor: strconv.FormatInt(page.Next, 10), HasMore: page.HasMore}
	for i, ch := range page.Items {
		out.Items[i] = streamChunkOut{Index: ch.Index, DataBase64: base64.StdEncoding.EncodeToString(ch.Data)}
	}
	return c.JSON(http.StatusOK, out)
}

// streamEvents is the live tail as Server-Sent Events: stored chunks from
// start_index (or after Last-Event-ID, which wins), then each chunk as it
// commits, keep-alive comments while idle, and an `end` event once the
// stream is closed and fully sent. The subscription is taken before the
// first read and before the response starts, so nothing committed after
// the client sees the headers is missed.
func (s *Server) streamEvents(c echo.Context) error {
	runID, name, err := streamParams(c)
	if err != nil {
		return err
	}
	from, err := sseStart(c)
	if err != nil {
		return err
	}
	release, err := s.streamCap.acquire(PrincipalFrom(c).OrgID)
	if err != nil {
		return err
	}
	defer release()
	tail, err := s.svc.Streams.Tail(PrincipalFrom(c).OrgID, runID, name, from)
	if err != nil {
		return streamProblem(err)
	}
	defer tail.Close()
	ctx := c.Request().Context()
	batch, err := tail.Next(ctx)
	if err != nil {
		return fmt.Errorf("reading stream %s/%s for SSE: %w", runID, name, err)
	}
	res := c.Response()
	res.Header().Set(echo.HeaderContentType, "text/event-stream")
	res.Header().Set(echo.HeaderCacheControl, "no-cache")
	res.Header().Set("X-Accel-Buffering", "no") // proxies must not hold events back
	res.WriteHeader(http.StatusOK)

	keepAlive := time.NewTicker(s.svc.Streams.Config().KeepAlive)
	defer keepAlive.Stop()
	expired, stop := tokenExpiry(c)
	defer stop()
	var buf []byte
	for {
		buf = appendSSEChunks(buf[:0], batch.Chunks)
		if batch.Ended {
			buf = fmt.Appendf(buf, "event: end\ndata: {\"tail_index\": %d}\n\n", batch.TailIndex)
		}
		// The first send flushes the headers.
		if err := s.sseSend(c, buf); err != nil {
			return nil // the client left
		}
		if batch.Ended {
			return nil
		}
		if cap(buf) > maxIdleSSEBuffer {
			// (a catch-up's megabytes are not kept while the reader waits
			// — in awaitStream or in the next read — perhaps for hours: a
			// thousand idle tails held ~14 GiB)
			buf = nil
		}
		if batch.More {
			if s.tokenExpiredNow(c, expired) {
				return nil
			}
			select {
			case <-tail.Done(): // the hub stops: a tail catching up ends too
				return nil
			default:
			}
		} else if !s.awaitStream(c, tail, keepAlive, expired) {
			return nil
		}
		if batch, err = tail.Next(ctx); err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("SSE stream read failed; closing the connection", "error", err.Error(), "run_id", runID, "name", name)
			}
			return nil // the client resumes with Last-Event-ID
		}
	}
}

// awaitStream waits until the stream may have changed, writing keep-alive
// comments meanwhile. It reports false when the client left, the server
// is stopping or the token expired.
func (s *Server) awaitStream(c echo.Context, tail *streams.Tail, keepAlive *time.Ticker, expired <-chan time.Time) bool {
	for {
		select {
		case <-tail.Ready():
			return true
		case <-expired:
			_ = s.sseSend(c, []byte(tokenExpiredComment))
			return false
		case <-c.Request().Context().Done():
			return false
		case <-tail.Done():
			return false
		case <-keepAlive.C:
			if s.sseSend(c, []byte(": keep-alive\n\n")) != nil {
				return false
			}
			// A notification lost between a writer's commit and its NOTIFY
			// stalls this reader at most until here.
			tail.Recheck()
		}
	}
}

// maxIdleSSEBuffer is the largest event buffer an SSE handler keeps
// while it waits for the stream to change.
const maxIdleSSEBuffer = 64 << 10

func appendSSEChunks(buf []byte, chunks []streams.Chunk) []byte {
	for _, ch := range chunks {
		buf = append(buf, "id: "...)
		buf = strconv.AppendInt(buf, ch.Index, 10)
		buf = append(buf, "\ndata: "...)
		buf = base64.StdEncoding.AppendEncode(buf, ch.Data)
		buf = append(buf, "\n\n"...)
	}
	return buf
}

// sseStart is the first index to send: one past Last-Event-ID when given,
// else start_index, else 0.
func sseStart(c echo.Context) (int64, error) {
	if last := c.Request().Header.Get("Last-Event-ID"); last != "" {
		id, err := streamIndex("Last-Event-ID", last)
		return id + 1, err
	}
	return streamIndex("start_index", c.QueryParam("start_index"))
}

// streamIndex parses a chunk index parameter ("" is 0).
func streamIndex(field, raw string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 || n > streams.MaxIndex {
		return 0, Invalid(field, fmt.Sprintf("must be a chunk index: an integer from 0 to %d", int64(streams.MaxIndex)))
	}
	return n, nil
}

// streamParams reads and validates the run id and stream name of the path.
func streamParams(c echo.Context) (runID, name string, err error) {
	if runID, err = streamPathParam(c, "run_id"); err != nil {
		return "", "", err
	}
	if name, err = streamPathParam(c, "name"); err != nil {
		return "", "", err
	}
	return runID, name, nil
}

// streamPathParam returns the path parameter run_id or name, unescaped
// (pathParam) and validated.
func streamPathParam(c echo.Context, param string) (string, error) {
	v, err := pathParam(c, param)
	if err != nil {
		return "", err
	}
	if err := streams.ValidateID(param, v); err != nil {
		return "", err
	}
	return v, nil
}

// streamProblem maps the streams errors that are not apperr kinds.
func streamProblem(err error) error {
	var tooLarge *streams.TooLargeError
	var tooMany *streams.TooManyChunksError
	switch {
	case errors.As(err, &tooLarge):
		return tooLargeProblem("chunk-too-large", tooLarge.What, tooLarge.Error())
	case errors.As(err, &tooMany):
		return tooLargeProblem("too-many-chunks", "chunks", tooMany.Error())
	case errors.Is(err, streams.ErrKeyReused):
		return NewProblem(http.StatusConflict, "idempotency-key-used",
			"this Idempotency-Key was used for a different append to this stream (by another caller, or before its replay record expired); use a new key for new chunks")
	case errors.Is(err, streams.ErrStopped):
		return stoppingProblem("live tails are")
	}
	return err
}

// tooLargeProblem is a 413 naming the field over its limit.
func tooLargeProblem(kind, field, detail string) *Problem {
	p := NewProblem(http.StatusRequestEntityTooLarge, kind, detail)
	p.Errors = []apperr.FieldError{{Field: field, Detail: detail}}
	return p
}
