package page

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestSizeDefaultsAndCaps(t *testing.T) {
	for _, tc := range []struct{ limit, want int }{{0, DefaultLimit}, {-3, DefaultLimit}, {1, 1}, {MaxLimit, MaxLimit}, {MaxLimit + 1, MaxLimit}} {
		require.Equal(t, tc.want, Page{Limit: tc.limit}.Size(), "limit %d", tc.limit)
	}
}

func TestAfterIsNilFromTheStart(t *testing.T) {
	require.Nil(t, Page{}.After())
	id := uuid.Must(uuid.NewV7())
	require.Equal(t, &id, Page{Cursor: id}.After())
}

func TestTrimReturnsTheNextCursorOnlyWhenMoreFollow(t *testing.T) {
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	self := func(id uuid.UUID) uuid.UUID { return id }

	items, next := Trim(ids, 2, self) // a query for 2 returned 3: more follow
	require.Equal(t, ids[:2], items)
	require.Equal(t, &ids[1], next)

	items, next = Trim(ids, 3, self)
	require.Equal(t, ids, items)
	require.Nil(t, next)
}
