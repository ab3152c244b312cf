package client_test

import (
	"context"
	"fmt"
	"iter"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

const listed = 1234

// createAll makes n objects with create, 8 at a time, and returns their ids.
func createAll(t *testing.T, n int, create func(i int) (string, error)) map[string]bool {
	t.Helper()
	var mu sync.Mutex
	created := map[string]bool{}
	next := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				id, err := create(i)
				if err != nil {
					t.Errorf("create %d: %v", i, err)
					continue
				}
				mu.Lock()
				created[id] = true
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	require.Len(t, created, n)
	return created
}

// The list iterators fetch page after page, and yield every item once.
func TestIteratorsPageThrough1234ItemsExactlyOnce(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	asAdmin, asAgent := newClient(t, e.url, admin, nil), newClient(t, e.url, agent, nil)
	_, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "many", Scope: "wake", Budget: listed})
	require.NoError(t, err)
	wakeups := createAll(t, listed, func(i int) (string, error) {
		w, err := asAgent.Wakeups.Create(ctx, wakeupRequest("many", i))
		return w.ID, err
	})
	mandates := createAll(t, listed, func(i int) (string, error) {
		m, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: fmt.Sprint("agent-", i), Scope: "s", Budget: 1})
		return m.ID, err
	})
	mandates[collect(t, asAdmin.Mandates.List(ctx, client.MandateListParams{AgentID: "many"}))[0].ID] = true

	cases := []struct {
		name  string
		path  string
		limit int
		pages int
		want  map[string]bool
		list  func(c *client.Client) iter.Seq2[string, error]
	}{
		{
			name: "wake-ups, 100 a page", path: "/v1/wakeups", limit: 100, pages: 13, want: wakeups,
			list: func(c *client.Client) iter.Seq2[string, error] {
				return ids2(c.Wakeups.List(ctx, client.WakeupListParams{AgentID: "many", PageParams: client.PageParams{Limit: 100}}),
					func(w client.Wakeup) string { return w.ID })
			},
		},
		{
			name: "mandates, the default 50 a page", path: "/v1/mandates", limit: 50, pages: 25, want: mandates,
			list: func(c *client.Client) iter.Seq2[string, error] {
				return ids2(c.Mandates.List(ctx, client.MandateListParams{}), func(m client.Mandate) string { return m.ID })
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			c := newClient(t, e.url, everyone, rec)
			seen := map[string]int{}
			for id, err := range tc.list(c) {
				require.NoError(t, err)
				seen[id]++
			}
			for id, n := range seen {
				require.Equal(t, 1, n, "%s yielded %d times", id, n)
			}
			require.Equal(t, len(tc.want), len(seen), "items yielded")
			for id := range tc.want {
				require.Contains(t, seen, id)
			}
			require.Len(t, rec.requests(http.MethodGet, tc.path), tc.pages)

			// Stopping early fetches no further page.
			rec = &recorder{}
			c = newClient(t, e.url, everyone, rec)
			n := 0
			for _, err := range tc.list(c) {
				require.NoError(t, err)
				if n++; n == tc.limit+1 {
					break
				}
			}
			require.Len(t, rec.requests(http.MethodGet, tc.path), 2)
		})
	}
}

// ids2 maps an iterator's items to their ids.
func ids2[T any](seq iter.Seq2[T, error], id func(T) string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for item, err := range seq {
			if !yield(id(item), err) {
				return
			}
		}
	}
}

// One iterator value is a recipe, not a cursor: each range of it — again
// later, or by several goroutines at once — starts from its params and
// yields every item, sharing nothing with the others (under -race, the
// race detector watches the params the pages' cursors once went into).
func TestAnIteratorRangedAgainOrByGoroutinesAtOnceYieldsEverythingToEach(t *testing.T) {
	e := startEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	asAdmin, asAgent, asApprover := newClient(t, e.url, admin, nil), newClient(t, e.url, agent, nil), newClient(t, e.url, approver, nil)
	const n = 12
	var chunks [][]byte
	for i := range n {
		_, err := asAdmin.Mandates.Create(ctx, client.MandateCreate{AgentID: "ranged", Scope: fmt.Sprint("s", i), Budget: 1})
		require.NoError(t, err)
		_, err = asAgent.Mandates.Spend(ctx, client.SpendRequest{AgentID: fmt.Sprint("refused-", i), Scope: "s", Cost: 1})
		require.True(t, client.IsSpendRefused(err), "%v", err)
		chunks = append(chunks, []byte(chunkText(i)))
	}
	_, err := asAgent.Streams.AppendBatch(ctx, "ranged", "out", chunks)
	require.NoError(t, err)

	var start int64
	cases := map[string]iter.Seq2[string, error]{
		"a list": ids2(asAdmin.Mandates.List(ctx, client.MandateListParams{AgentID: "ranged", PageParams: client.PageParams{Limit: 5}}),
			func(m client.Mandate) string { return m.ID }),
		"a stream's chunks": ids2(asAgent.Streams.Chunks(ctx, "ranged", "out", client.ChunkParams{Limit: 5}),
			func(ch client.StreamChunk) string { return string(ch.Data) }),
		"approval events": ids2(asApprover.Approvals.Events(ctx, client.ApprovalEventsParams{After: &start}),
			func(ev client.ApprovalEvent) string { return fmt.Sprint(ev.Seq) }),
	}
	// take ranges seq for its first n items (the events never end).
	take := func(seq iter.Seq2[string, error]) ([]string, error) {
		var got []string
		for id, err := range seq {
			if err != nil {
				return got, err
			}
			if got = append(got, id); len(got) == n {
				break
			}
		}
		return got, nil
	}
	for name, seq := range cases {
		t.Run(name, func(t *testing.T) {
			first, err := take(seq)
			require.NoError(t, err)
			require.Len(t, first, n)
			again, err := take(seq)
			require.NoError(t, err)
			require.Equal(t, first, again, "ranged again, it starts again")

			got := make([][]string, 4)
			errs := make([]error, len(got))
			var wg sync.WaitGroup
			for i := range got {
				wg.Go(func() { got[i], errs[i] = take(seq) })
			}
			wg.Wait()
			for i := range got {
				require.NoError(t, errs[i])
				require.Equal(t, first, got[i], "goroutine %d", i)
			}
		})
	}
}
