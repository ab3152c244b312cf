package client_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/reveille/reveille/client"
)

// h2Request is one request the HTTP/2 stand-in read whole.
type h2Request struct {
	method, path, key string
	body              []byte
}

// h2Answer is what the stand-in does with the nth request it read whole
// (from 1): reset its stream with reset, shut its connection down
// gracefully before it (goAway: the stream not processed), or else answer
// status and body.
type h2Answer struct {
	reset  http2.ErrCode
	goAway bool
	status int
	body   string
}

// serveH2 is an HTTP/2 server over cleartext (prior knowledge), built
// frame by frame: a stream reset by the server is what net/http's own
// server cannot be made to send after it read a request. It returns the
// server's URL and the requests it read whole.
func serveH2(t *testing.T, answer func(n int) h2Answer) (string, func() []h2Request) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		seen []h2Request
		wg   sync.WaitGroup
	)
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	serve := func(conn net.Conn) {
		defer conn.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(conn, preface); err != nil || string(preface) != http2.ClientPreface {
			return
		}
		out := bufio.NewWriter(conn)
		fr := http2.NewFramer(out, conn)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		_ = fr.WriteSettings()
		_ = out.Flush()
		open := map[uint32]*h2Request{}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			var ended uint32
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = fr.WritePing(true, f.Data)
				}
			case *http2.MetaHeadersFrame:
				r := &h2Request{method: f.PseudoValue("method"), path: f.PseudoValue("path")}
				for _, hf := range f.RegularFields() {
					if hf.Name == "idempotency-key" {
						r.key = hf.Value
					}
				}
				open[f.StreamID] = r
				if f.StreamEnded() {
					ended = f.StreamID
				}
			case *http2.DataFrame:
				if r := open[f.StreamID]; r != nil {
					r.body = append(r.body, f.Data()...)
				}
				if len(f.Data()) > 0 {
					_ = fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				}
				if f.StreamEnded() {
					ended = f.StreamID
				}
			}
			if r := open[ended]; ended != 0 && r != nil {
				delete(open, ended)
				mu.Lock()
				seen = append(seen, *r)
				n := len(seen)
				mu.Unlock()
				a := answer(n)
				switch {
				case a.goAway:
					_ = fr.WriteGoAway(ended-1, http2.ErrCodeNo, nil)
				case a.reset != 0:
					_ = fr.WriteRSTStream(ended, a.reset)
				default:
					contentType := "application/json"
					if a.status >= 300 {
						contentType = "application/problem+json"
					}
					hbuf.Reset()
					_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(a.status)})
					_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: contentType})
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: ended, BlockFragment: hbuf.Bytes(), EndHeaders: true})
					_ = fr.WriteData(ended, true, []byte(a.body))
				}
			}
			if err := out.Flush(); err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); serve(conn) }()
		}
	}()
	return "http://" + ln.Addr().String(), func() []h2Request {
		mu.Lock()
		defer mu.Unlock()
		return append([]h2Request(nil), seen...)
	}
}

// h2Client talks HTTP/2 over cleartext to url, with up to maxAttempts
// attempts a call (default 3).
func h2Client(t *testing.T, url string, maxAttempts ...int) *client.Client {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	attempts := 3
	if len(maxAttempts) > 0 {
		attempts = maxAttempts[0]
	}
	c, err := client.New(url, client.WithToken("t"), client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: attempts, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	require.NoError(t, err)
	return c
}

const inFlight = `{"type":"https://reveille.dev/problems/idempotency-key-in-flight","title":"in flight","status":409}`

// Over HTTP/2, net/http sends a request again by itself when the server
// resets its stream with PROTOCOL_ERROR — also after the server read it
// whole, and may have acted on it. A keyed request is not sent again by
// net/http (its body cannot be rewound): the client's own retry loop sees
// the lost answer, so a keyed call whose later attempts meet only 409 in
// flight is a *MaybeAppliedError naming its key, not a plain error. Before,
// net/http's unseen resend made it a plain *Error, and the caller's retry
// under a new key acted twice.
func TestAKeyedCallWhoseHTTP2StreamWasResetAfterItWasReadMayHaveBeenApplied(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func(c *client.Client) error
	}{
		{"with a body (a spend)", func(c *client.Client) error {
			_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
			return err
		}},
		{"without one (a stream's close)", func(c *client.Client) error {
			return c.Streams.Close(ctx, "run", "out")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, requests := serveH2(t, func(n int) h2Answer {
				if n == 1 {
					return h2Answer{reset: http2.ErrCodeProtocol}
				}
				return h2Answer{status: http.StatusConflict, body: inFlight}
			})
			err := tc.call(h2Client(t, url))
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe, "the first request was read whole: %v", err)
			require.NotEmpty(t, maybe.IdempotencyKey)
			reqs := requests()
			require.Len(t, reqs, 3, "one request an attempt: net/http sent none again by itself")
			for _, r := range reqs {
				require.Equal(t, maybe.IdempotencyKey, r.key, "every attempt under the call's key")
			}
		})
	}
}

// A stream the server refused (REFUSED_STREAM: not processed) is sent
// again, under the same key, and the call gets its answer: net/http no
// longer resends it, the client's loop does.
func TestAKeyedCallWhoseHTTP2StreamWasRefusedIsSentAgainUnderItsKey(t *testing.T) {
	url, requests := serveH2(t, func(n int) h2Answer {
		if n == 1 {
			return h2Answer{reset: http2.ErrCodeRefusedStream}
		}
		return h2Answer{status: http.StatusPaymentRequired, body: `{"type":"https://reveille.dev/problems/mandate-exceeded","title":"over","status":402}`}
	})
	_, err := h2Client(t, url).Mandates.Spend(context.Background(), client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
	require.Equal(t, http.StatusPaymentRequired, client.StatusOf(err), "%v", err)
	var maybe *client.MaybeAppliedError
	require.False(t, errors.As(err, &maybe), "the server's answer for the key stands: %v", err)
	reqs := requests()
	require.Len(t, reqs, 2)
	require.Equal(t, reqs[0].key, reqs[1].key)
	require.JSONEq(t, string(reqs[0].body), string(reqs[1].body), "the same body sent again")
}

// A request the server did not process — its stream refused
// (REFUSED_STREAM), or above the last stream of a graceful shutdown
// (GOAWAY: a draining server or proxy, in every rolling deploy) — is sent
// again at once, not counted as an attempt, key or no key, as net/http
// sends again such a request it may rewind: with retries disabled the call
// still gets its answer, and nothing says it may have been applied. (A
// review proved both made maybe-applied errors of calls nothing acted on,
// once a keyed request's body could no longer be rewound.)
func TestARequestAnHTTP2ServerDidNotProcessIsSentAgainAtOnce(t *testing.T) {
	ctx := context.Background()
	for _, first := range []struct {
		name   string
		answer h2Answer
	}{
		{"refused", h2Answer{reset: http2.ErrCodeRefusedStream}},
		{"past a graceful shutdown", h2Answer{goAway: true}},
	} {
		for _, tc := range []struct {
			name string
			opts []client.CallOption
		}{
			{"with its key", nil},
			{"without one", []client.CallOption{client.WithoutIdempotencyKey()}},
		} {
			t.Run(first.name+" "+tc.name, func(t *testing.T) {
				url, requests := serveH2(t, func(n int) h2Answer {
					if n == 1 {
						return first.answer
					}
					return h2Answer{status: http.StatusOK, body: `{"ok":true,"remaining":4}`}
				})
				res, err := h2Client(t, url, 1).Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1}, tc.opts...)
				require.NoError(t, err)
				require.True(t, res.OK)
				reqs := requests()
				require.Len(t, reqs, 2)
				require.Equal(t, reqs[0].key, reqs[1].key)
			})
		}
	}
	t.Run("then answered a 429 not waited out", func(t *testing.T) {
		url, _ := serveH2(t, func(n int) h2Answer {
			if n == 1 {
				return h2Answer{reset: http2.ErrCodeRefusedStream}
			}
			return h2Answer{status: http.StatusTooManyRequests, body: `{"type":"https://reveille.dev/problems/rate-limited","title":"slow down","status":429}`}
		})
		_, err := h2Client(t, url, 1).Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
		require.Equal(t, http.StatusTooManyRequests, client.StatusOf(err), "%v", err)
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "the only request processed was answered 429: %v", err)
	})
	t.Run("refused every time", func(t *testing.T) {
		url, requests := serveH2(t, func(int) h2Answer { return h2Answer{reset: http2.ErrCodeRefusedStream} })
		_, err := h2Client(t, url, 2).Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1})
		require.ErrorContains(t, err, "REFUSED_STREAM")
		var maybe *client.MaybeAppliedError
		require.False(t, errors.As(err, &maybe), "%v", err)
		require.Len(t, requests(), 6+2, "six sent again, and each of the two attempts")
	})
}

// A call without a key (one made WithoutIdempotencyKey, a redelivery)
// whose HTTP/2 stream the server reset with PROTOCOL_ERROR after reading it
// is not sent again — by net/http or by the client: it may have acted, and
// it says so. Before, net/http sent it again by itself, and the call
// reported one success for two actions.
func TestAnUnkeyedCallWhoseHTTP2StreamWasResetAfterItWasReadIsNotSentAgain(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func(c *client.Client) error
	}{
		{"a spend without its key", func(c *client.Client) error {
			_, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "a", Scope: "s", Cost: 1}, client.WithoutIdempotencyKey())
			return err
		}},
		{"a wake-up's redelivery", func(c *client.Client) error {
			_, err := c.Wakeups.Redeliver(ctx, "0190f0f0-0000-7000-8000-000000000000")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, requests := serveH2(t, func(n int) h2Answer {
				if n == 1 {
					return h2Answer{reset: http2.ErrCodeProtocol}
				}
				return h2Answer{status: http.StatusOK, body: `{"ok":true,"remaining":4}`}
			})
			err := tc.call(h2Client(t, url))
			var maybe *client.MaybeAppliedError
			require.ErrorAs(t, err, &maybe, "%v", err)
			require.Empty(t, maybe.IdempotencyKey)
			require.Len(t, requests(), 1, "sent once")
		})
	}
}
