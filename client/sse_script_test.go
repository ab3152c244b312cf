package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// scriptedSSE is an event-stream server whose connection i runs
// answers[i]; it records the Last-Event-ID each connection sent.
type scriptedSSE struct {
	mu      sync.Mutex
	lastIDs []string
	url     string
}

func newScriptedSSE(t *testing.T, answers ...func(w http.ResponseWriter)) *scriptedSSE {
	s := &scriptedSSE{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		i := len(s.lastIDs)
		s.lastIDs = append(s.lastIDs, r.Header.Get("Last-Event-ID"))
		s.mu.Unlock()
		if i >= len(answers) {
			http.Error(w, "no more answers", http.StatusTeapot)
			return
		}
		answers[i](w)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *scriptedSSE) sentIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lastIDs...)
}

// eventStream writes body as an event stream and ends the connection.
func eventStream(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	}
}

func fastReconnect() client.Option {
	return client.WithReconnect(client.ReconnectPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
}

// The standard: an id field with no value sets the last event ID to
// empty, and the reconnect then sends none.
func TestAnEmptyIDFieldClearsTheLastEventIDTheReaderResumesFrom(t *testing.T) {
	srv := newScriptedSSE(t,
		eventStream("id: 7\nevent: requested\ndata: {\"seq\":7}\n\nid\nevent: requested\ndata: {\"seq\":8}\n\n"),
		func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"title":"x","status":404}`)
		})
	c := newClient(t, srv.url, approver, nil, fastReconnect())
	var seqs []int64
	for ev, err := range c.Approvals.Events(t.Context(), client.ApprovalEventsParams{}) {
		if err != nil {
			break
		}
		seqs = append(seqs, ev.Seq)
	}
	require.Equal(t, []int64{7, 8}, seqs)
	require.Equal(t, []string{"", ""}, srv.sentIDs())
}

// WithTokenFunc: "An error from f fails the call." A live reader whose
// token function fails (a revoked refresh token, no credentials) ends with
// that error, as any call does, rather than asking it again and again,
// yielding nothing, until its context ends.
func TestALiveReaderEndsWithItsTokenFunctionsError(t *testing.T) {
	srv := newScriptedSSE(t, eventStream("id: 0\ndata: YQ==\n\nevent: end\ndata: {\"tail_index\": 0}\n\n"))
	errNoCreds := errors.New("no credentials")
	var asked atomic.Int32
	c, err := client.New(srv.url, client.WithTokenFunc(func(context.Context) (string, error) {
		asked.Add(1)
		return "", errNoCreds
	}), fastReconnect())
	require.NoError(t, err)
	// (the deadline only ends the test should the reader never give up)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	readers := map[string]func(yield func(error) bool){
		"Streams.Tail": func(yield func(error) bool) {
			for _, err := range c.Streams.Tail(ctx, "run", "out", client.TailParams{}) {
				if !yield(err) {
					return
				}
			}
		},
		"Approvals.Events": func(yield func(error) bool) {
			for _, err := range c.Approvals.Events(ctx, client.ApprovalEventsParams{}) {
				if !yield(err) {
					return
				}
			}
		},
	}
	for name, read := range readers {
		asked.Store(0)
		var errs []error
		for err := range read {
			errs = append(errs, err)
		}
		require.Len(t, errs, 1, name)
		require.ErrorIs(t, errs[0], errNoCreds, name)
		require.NoError(t, ctx.Err(), name)
		require.EqualValues(t, 1, asked.Load(), "%s: the token function was asked once", name)
	}
	require.Empty(t, srv.sentIDs(), "nothing was sent")
}
