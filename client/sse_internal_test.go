package client

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/streams"
)

// The event stream parser follows the WHATWG standard's "interpreting an
// event stream": what it dispatches, and the last event ID a reconnect
// sends.
func TestEventStreamsParseAsTheStandardSays(t *testing.T) {
	cases := []struct {
		name   string
		stream string
		want   []Event
		lastID string
	}{
		{
			name:   "events with ids, a named event and a comment",
			stream: ": keep-alive\n\nid: 0\ndata: YQ==\n\nid: 1\ndata: Yg==\n\nevent: end\ndata: {\"tail_index\": 1}\n\n",
			want: []Event{{ID: "0", Type: "message", Data: "YQ=="}, {ID: "1", Type: "message", Data: "Yg=="},
				{ID: "1", Type: "end", Data: `{"tail_index": 1}`}},
			lastID: "1",
		},
		{
			name:   "CRLF and CR line ends; data lines joined",
			stream: "id: 7\r\ndata: a\r\ndata: b\r\n\r\ndata:c\r\rid\n\n",
			want:   []Event{{ID: "7", Type: "message", Data: "a\nb"}, {ID: "7", Type: "message", Data: "c"}},
			lastID: "",
		},
		{
			name:   "an id without data is kept, and no event is dispatched",
			stream: "id: 3\n\n",
			lastID: "3",
		},
		{
			name:   "an event the connection cut short is dropped, its id too",
			stream: "id: 1\ndata: x\n\nid: 2\ndata: y\n",
			want:   []Event{{ID: "1", Type: "message", Data: "x"}},
			lastID: "1",
		},
		{
			name:   "an id holding NUL is ignored; a field without a colon is a name",
			stream: "id: 1\ndata: x\n\nid: a\x00b\ndata\n\n",
			want:   []Event{{ID: "1", Type: "message", Data: "x"}, {ID: "1", Type: "message", Data: ""}},
			lastID: "1",
		},
		{
			name:   "one leading byte order mark is ignored, a second one is not",
			stream: "\xEF\xBB\xBFid: 0\ndata: x\n\n\xEF\xBB\xBFid: 1\ndata: y\n\n",
			want:   []Event{{ID: "0", Type: "message", Data: "x"}, {ID: "0", Type: "message", Data: "y"}},
			lastID: "0",
		},
		{
			name:   "a byte order mark alone on the first line leaves a blank line",
			stream: "\xEF\xBB\xBF\nid: 2\ndata: z\n\n",
			want:   []Event{{ID: "2", Type: "message", Data: "z"}},
			lastID: "2",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// One byte per read: a CRLF split over two reads is one line end.
			r := newEventReader(iotest.OneByteReader(strings.NewReader(tc.stream)))
			var got []Event
			for {
				ev, err := r.next()
				if err != nil {
					require.ErrorIs(t, err, io.ErrUnexpectedEOF)
					break
				}
				got = append(got, ev)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.lastID, r.lastID)
		})
	}
}

// A connection that could not be opened never carried the request, so
// even a call that must not be repeated may be tried again; a connection
// lost later may have.
func TestOnlyAConnectionNeverOpenedCountsAsNeverSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, refused := http.Get("http://" + closedAddr + "/")
	require.Error(t, refused)

	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"connection lost mid-answer", io.ErrUnexpectedEOF, false},
		{"the token source failed", &tokenError{errors.New("vault down")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, neverSent(tc.err))
		})
	}
}

// Each wait doubles up to the cap, drawn from [half of the step, the step].
func TestBackoffDoublesUpToItsCapWithJitter(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}.withDefaults()
	cases := []struct {
		attempt int
		step    time.Duration
	}{
		{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond}, {5, time.Second}, {50, time.Second},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint("after attempt ", tc.attempt), func(t *testing.T) {
			for range 200 {
				d := p.backoff(tc.attempt)
				require.GreaterOrEqual(t, d, tc.step/2)
				require.LessOrEqual(t, d, tc.step)
			}
		})
	}
}

// Tail reads every chunk the server can accept: the largest
// (streams.MaxChunkLimit) comes as one SSE data line of base64, which must
// fit the reader's line bound with room for its field name and the
// event's JSON around it. REVEILLE_STREAM_MAX_CHUNK had no upper bound, and
// Tail ended for good at a 25 MiB chunk ("a line longer than 33554432
// bytes") that Chunks read. (Computed, not streamed: a 16 MiB chunk under
// -race takes minutes.)
func TestTheLargestChunkTheServerAcceptsFitsAnSSELine(t *testing.T) {
	require.Less(t, base64.StdEncoding.EncodedLen(streams.MaxChunkLimit)+4096, maxSSELine)
}

// A retry field of ASCII digits sets the stream's reconnection time, in
// milliseconds; any other value leaves it as it was (the WHATWG standard).
func TestARetryFieldOfDigitsSetsTheReconnectionTime(t *testing.T) {
	for _, tc := range []struct {
		stream string
		want   time.Duration
	}{
		{"retry: 1500\n\n", 1500 * time.Millisecond},
		{"retry: 1500\nretry: 20\n\n", 20 * time.Millisecond},
		{"retry: 1500\nretry: 2s\n\n", 1500 * time.Millisecond},
		{"retry: +5\n\n", 0},
		{"retry: -5\n\n", 0},
		{"retry:\n\n", 0},
		{"retry: 99999999999999\n\n", 0},
		{"retry: 3000\nretry: 0\n\n", 0}, // (0 is a time: at once)
	} {
		r := newEventReader(strings.NewReader(tc.stream))
		_, err := r.next()
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, tc.want, r.retry, "%q", tc.stream)
		require.Equal(t, strings.Contains(tc.stream, "0\n"), r.retrySet, "%q", tc.stream)
	}
}
