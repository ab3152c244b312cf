package client

import (
	"context"
	"iter"
	"net/url"
	"strconv"
)

// Page is one page of a list: `{items, next_cursor}`. NextCursor is nil on
// the last page.
type Page[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
	// EventsSeq (the approval lists only) is the org's approvals event seq
	// this page reflects: follow Approvals.Events from the smaller of the
	// two lists' values to miss nothing.
	EventsSeq int64 `json:"events_seq,omitempty"`
}

// PageParams are the paging parameters every list takes.
type PageParams struct {
	// Limit is the page size (1–500; 0: the API's default, 50). An
	// iterator fetches pages of this size.
	Limit int
	// Cursor starts after the item a previous page's NextCursor named
	// (empty: from the start).
	Cursor string
}

func (p PageParams) addTo(q url.Values) url.Values {
	if q == nil {
		q = url.Values{}
	}
	if p.Limit != 0 { // (a negative one too: the server's 400 names it)
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	return q
}

// setIf sets q[name] when value is not empty.
func setIf(q url.Values, name, value string) {
	if value != "" {
		q.Set(name, value)
	}
}

// all iterates over every item of a cursor-paged list from start on,
// fetching page after page with fetch until one has no next cursor. An
// error is yielded once, and ends the iteration. Each range of the
// iterator starts again from start, on its own: fetch is called by every
// one of them, from their goroutines, so it must change nothing it shares
// (a list's params are copied before their cursor is set).
func all[T any](ctx context.Context, start string, fetch func(ctx context.Context, cursor string) (Page[T], error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		cursor := start
		for {
			page, err := fetch(ctx, cursor)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, item := range page.Items {
				if !yield(item, nil) {
					return
				}
			}
			if page.NextCursor == nil || *page.NextCursor == "" || *page.NextCursor == cursor {
				return
			}
			cursor = *page.NextCursor
		}
	}
}
