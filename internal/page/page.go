// Package page is keyset pagination over uuid v7 ids, as the domain
// packages' lists use it: a page is the items after a cursor (an id), and
// a query asks for one more than the page to learn whether another follows.
package page

import "github.com/google/uuid"

// MaxLimit is the largest page.
const MaxLimit = 500

// DefaultLimit is the page size when none is asked for.
const DefaultLimit = 50

// Page asks for one page of a list: items after Cursor (uuid.Nil: from the
// start), at most Limit of them (default DefaultLimit, at most MaxLimit).
type Page struct {
	Cursor uuid.UUID
	Limit  int
}

// Size is the page's effective limit.
func (p Page) Size() int {
	if p.Limit <= 0 {
		return DefaultLimit
	}
	return min(p.Limit, MaxLimit)
}

// After is the cursor as a query argument: nil from the start.
func (p Page) After() *uuid.UUID {
	if p.Cursor == uuid.Nil {
		return nil
	}
	return &p.Cursor
}

// Trim cuts a query's Size()+1 rows to the page and returns the cursor of
// the next page (nil at the end).
func Trim[T any](items []T, size int, id func(T) uuid.UUID) ([]T, *uuid.UUID) {
	if len(items) <= size {
		return items, nil
	}
	items = items[:size]
	next := id(items[size-1])
	return items, &next
}
