package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
)

// StreamsService calls the run stream routes (/v1/runs/{run_id}/streams):
// ordered chunks an agent appends and readers page or follow live.
type StreamsService struct{ c *Client }

// StreamRange is the indexes an append gave its chunks.
type StreamRange struct {
	FirstIndex int64 `json:"first_index"`
	LastIndex  int64 `json:"last_index"`
}

// StreamInfo is a stream's state.
type StreamInfo struct {
	// TailIndex is the last chunk's index, -1 when there is none (or the
	// stream is absent).
	TailIndex int64 `json:"tail_index"`
	// Done says the stream is closed.
	Done bool `json:"done"`
}

// StreamChunk is one chunk of a stream.
type StreamChunk struct {
	Index int64
	Data  []byte
}

// ChunkPage is a page of chunks. NextCursor is the next index to read, set
// also at the end, so that a poller keeps its place; HasMore says chunks
// at NextCursor or later are stored now.
type ChunkPage struct {
	Items      []StreamChunk
	NextCursor string
	HasMore    bool
}

// ChunkParams page the chunks of a stream.
type ChunkParams struct {
	// StartIndex is the first index to read (default 0; a negative one is
	// the server's 400); Cursor, a previous page's NextCursor, wins over it.
	StartIndex int64
	Cursor     string
	// Limit is the page size (1–500; 0: 50).
	Limit int
}

type chunkJSON struct {
	Index      int64  `json:"index"`
	DataBase64 string `json:"data_base64"`
}

type chunkPageJSON struct {
	Items      []chunkJSON `json:"items"`
	NextCursor string      `json:"next_cursor"`
	HasMore    bool        `json:"has_more"`
}

type appendJSON struct {
	Chunks []appendChunkJSON `json:"chunks"`
}

type appendChunkJSON struct {
	DataBase64 string `json:"data_base64"`
}

func streamPath(runID, name string, rest ...string) string {
	return pathOf(append([]string{"v1", "runs", runID, "streams", name}, rest...)...)
}

// Append appends one chunk (sent as application/octet-stream). The call
// carries an Idempotency-Key, so a retry appends nothing twice.
func (s *StreamsService) Append(ctx context.Context, runID, name string, data []byte, opts ...CallOption) (StreamRange, error) {
	ep := endpoint{method: http.MethodPost, path: streamPath(runID, name, "chunks"), safety: keyed, contentType: "application/octet-stream",
		argErr: needArgs("Streams.Append", "runID", runID, "name", name)}
	var out StreamRange
	if data == nil {
		data = []byte{}
	}
	err := s.c.do(ctx, ep, data, opts, func(res *http.Response) error { return decodeJSON(res, &out) })
	return out, err
}

// AppendBatch appends chunks atomically, at consecutive indexes.
func (s *StreamsService) AppendBatch(ctx context.Context, runID, name string, chunks [][]byte, opts ...CallOption) (StreamRange, error) {
	in := appendJSON{Chunks: make([]appendChunkJSON, len(chunks))}
	for i, ch := range chunks {
		in.Chunks[i].DataBase64 = base64.StdEncoding.EncodeToString(ch)
	}
	ep := endpoint{method: http.MethodPost, path: streamPath(runID, name, "chunks"), safety: keyed, argErr: needArgs("Streams.AppendBatch", "runID", runID, "name", name)}
	return doJSON[StreamRange](ctx, s.c, ep, in, opts)
}

// Close closes a stream (creating it empty and closed when absent).
func (s *StreamsService) Close(ctx context.Context, runID, name string, opts ...CallOption) error {
	return doNoContent(ctx, s.c, endpoint{method: http.MethodPost, path: streamPath(runID, name, "close"), safety: keyed, repeatable: true,
		argErr: needArgs("Streams.Close", "runID", runID, "name", name)}, nil, opts)
}

// Info returns a stream's tail index and state.
func (s *StreamsService) Info(ctx context.Context, runID, name string, opts ...CallOption) (StreamInfo, error) {
	return doJSON[StreamInfo](ctx, s.c, endpoint{method: http.MethodGet, path: streamPath(runID, name), argErr: needArgs("Streams.Info", "runID", runID, "name", name)}, nil, opts)
}

// Names iterates over a run's stream names, in byte order.
func (s *StreamsService) Names(ctx context.Context, runID string, p PageParams, opts ...CallOption) iter.Seq2[string, error] {
	return all(ctx, p.Cursor, func(ctx context.Context, cursor string) (Page[string], error) {
		p := p // (its own copy: one iterator may be ranged by goroutines at once)
		p.Cursor = cursor
		return s.NamesPage(ctx, runID, p, opts...)
	})
}

// NamesPage returns one page of a run's stream names.
func (s *StreamsService) NamesPage(ctx context.Context, runID string, p PageParams, opts ...CallOption) (Page[string], error) {
	ep := endpoint{method: http.MethodGet, path: pathOf("v1", "runs", runID, "streams"), query: p.addTo(nil), argErr: needArgs("Streams.NamesPage", "runID", runID)}
	return doJSON[Page[string]](ctx, s.c, ep, nil, opts)
}

// Chunks iterates over the chunks stored now, from p's index on (a
// stream still written to may get more later: Tail follows it). It yields
// ErrStreamGap where chunks are missing: retention is purging, or has
// purged while it read, the closed stream.
func (s *StreamsService) Chunks(ctx context.Context, runID, name string, p ChunkParams, opts ...CallOption) iter.Seq2[StreamChunk, error] {
	return func(yield func(StreamChunk, error) bool) {
		p := p // (its own copy: one iterator may be ranged again, or by goroutines at once)
		// promised: a page said more chunks were stored
		promised := false
		for {
			page, err := s.ChunksPage(ctx, runID, name, p, opts...)
			if err != nil {
				yield(StreamChunk{}, err)
				return
			}
			next := p.StartIndex
			if p.Cursor != "" {
				next, _ = strconv.ParseInt(p.Cursor, 10, 64)
			}
			for _, ch := range page.Items {
				if ch.Index != next {
					yield(StreamChunk{}, fmt.Errorf("%w: got %d, expected %d", ErrStreamGap, ch.Index, next))
					return
				}
				next = ch.Index + 1
				if !yield(ch, nil) {
					return
				}
			}
			if page.NextCursor != strconv.FormatInt(next, 10) {
				// (the server went past chunks a purge deleted)
				yield(StreamChunk{}, fmt.Errorf("%w: the next page starts at %s, after chunk %d", ErrStreamGap, page.NextCursor, next-1))
				return
			}
			if len(page.Items) == 0 && promised {
				// (the page before said chunks were stored from here on:
				// a stream loses chunks only to retention's purge)
				yield(StreamChunk{}, fmt.Errorf("%w: chunks from %d on were stored and are gone", ErrStreamGap, next))
				return
			}
			if !page.HasMore || len(page.Items) == 0 {
				return
			}
			promised = true
			p.Cursor = page.NextCursor
		}
	}
}

// ChunksPage returns one page of chunks.
func (s *StreamsService) ChunksPage(ctx context.Context, runID, name string, p ChunkParams, opts ...CallOption) (ChunkPage, error) {
	q := url.Values{}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	} else if p.StartIndex != 0 {
		// (a negative one too: the server's 400 names it)
		q.Set("start_index", strconv.FormatInt(p.StartIndex, 10))
	}
	if p.Limit != 0 { // (a negative one too: the server's 400 names it)
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	raw, err := doJSON[chunkPageJSON](ctx, s.c, endpoint{method: http.MethodGet, path: streamPath(runID, name, "chunks"), query: q,
		argErr: needArgs("Streams.ChunksPage", "runID", runID, "name", name)}, nil, opts)
	if err != nil {
		return ChunkPage{}, err
	}
	out := ChunkPage{NextCursor: raw.NextCursor, HasMore: raw.HasMore, Items: make([]StreamChunk, len(raw.Items))}
	for i, ch := range raw.Items {
		data, err := base64.StdEncoding.DecodeString(ch.DataBase64)
		if err != nil {
			return ChunkPage{}, fmt.Errorf("client: chunk %d of %s/%s is not base64: %w", ch.Index, runID, name, err)
		}
		out.Items[i] = StreamChunk{Index: ch.Index, Data: data}
	}
	return out, nil
}
