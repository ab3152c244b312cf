package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/streams"
	"github.com/reveille/reveille/workpool"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var testSecret = []byte("client-test-secret-of-at-least-32-bytes")

// The orgs of the tests; org-a's operator role counts (pool settings).
const (
	orgA = "org-a"
	orgB = "org-b"
)

// engine is the whole service (service.Run: every part, the API on a real
// listener) on a fresh database. Temporal is absent: its client is lazy,
// and nothing here needs a signal delivered.
type engine struct {
	svc *service.Service
	url string
}

// startEngine runs the service until the test ends. mutate adjusts its
// config (the API's rate limit, …).
func startEngine(t *testing.T, mutate ...func(*service.Config)) *engine {
	t.Helper()
	cfg := service.Config{
		DatabaseURL:     testkit.NewDatabase(t),
		TemporalAddress: "127.0.0.1:1",
		API: api.Config{Addr: "127.0.0.1:0", Auth: api.AuthConfig{Secrets: [][]byte{testSecret}, OperatorOrgs: []string{orgA}},
			ShutdownTimeout: 5 * time.Second},
		// "parked" runs one item at a time and its handler "block" never
		// returns: wake-ups there stay pending, and no signal is due.
		Workpool: workpool.Config{Pools: map[string]int{"default": 4, "wakeup": 4, "parked": 1},
			Cooldown: 50 * time.Millisecond, LeaderRetry: 50 * time.Millisecond, StopGrace: 100 * time.Millisecond},
		// Idle SSE connections hear from the server often, so that the
		// tests see keep-alives (and the server ends tails at shutdown).
		Streams:     streams.Config{KeepAlive: time.Second},
		StopTimeout: 10 * time.Second,
		Logger:      testkit.Logger(t),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	svc, err := service.New(context.Background(), cfg)
	require.NoError(t, err)
	svc.Workpool().Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
	svc.Workpool().Register("block", func(ctx context.Context, _ workpool.Job) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, func(a net.Addr) { addr <- a.String() }) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		svc.Close()
	})
	select {
	case a := <-addr:
		return &engine{svc: svc, url: "http://" + a}
	case err := <-done:
		t.Fatalf("the service ended before it listened: %v", err)
		return nil
	}
}

// who is a token's principal.
type who struct {
	org, sub, agent string
	roles           []string
}

var (
	admin    = who{org: orgA, sub: "root", roles: []string{api.RoleAdmin}}
	agent    = who{org: orgA, sub: "runtime", roles: []string{api.RoleAgent}}
	approver = who{org: orgA, sub: "alice", roles: []string{api.RoleApprover}}
	operator = who{org: orgA, sub: "ops", roles: []string{api.RoleOperator}}
	// everyone holds every role (not bound to an agent).
	everyone = who{org: orgA, sub: "all", roles: []string{api.RoleAdmin, api.RoleAgent, api.RoleApprover, api.RoleOperator}}
)

func (w who) token(t *testing.T) string {
	t.Helper()
	tok, err := api.SignToken(testSecret, api.TokenSpec{OrgID: w.org, Sub: w.sub, AgentID: w.agent, Roles: w.roles, TTL: time.Hour})
	require.NoError(t, err)
	return tok
}

// newClient is a client of baseURL as w, its requests seen by rec when
// given. Keep-alives are off: every attempt opens its own connection, so
// that net/http never repeats a request on its own (it does so, once, on a
// reused connection) and the retries seen are the client's.
func newClient(t *testing.T, baseURL string, w who, rec *recorder, opts ...client.Option) *client.Client {
	t.Helper()
	var rt http.RoundTripper = &http.Transport{DisableKeepAlives: true}
	if rec != nil {
		rec.next = rt
		rt = rec
	}
	opts = append([]client.Option{client.WithToken(w.token(t)), client.WithHTTPClient(&http.Client{Transport: rt}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 4, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})}, opts...)
	c, err := client.New(baseURL, opts...)
	require.NoError(t, err)
	return c
}

// recorder is the client's transport seen from outside: every request
// sent, attempts included.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	method, path string // path escaped, as sent
	header       http.Header
	status       int // 0: no response
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := r.next.RoundTrip(req)
	// (names canonical, as a server reads them)
	header := http.Header{}
	for name, values := range req.Header {
		for _, v := range values {
			header.Add(name, v)
		}
	}
	rec := recorded{method: req.Method, path: req.URL.EscapedPath(), header: header}
	if err == nil {
		rec.status = res.StatusCode
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, rec)
	r.mu.Unlock()
	return res, err
}

// requests returns the requests sent to method and path.
func (r *recorder) requests(method, path string) []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recorded
	for _, q := range r.reqs {
		if q.method == method && q.path == path {
			out = append(out, q)
		}
	}
	return out
}

func (r *recorder) all() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.reqs...)
}

// faultProxy forwards TCP connections to the API and injects the network
// faults a client must survive, which the API cannot be made to cause:
// a connection cut after the request reached the server (the answer is
// lost), a connection cut or gone silent at a chosen place in an answer,
// and a load balancer's 503 in front of the API.
type faultProxy struct {
	target string

	mu sync.Mutex
	// ln is the listener, replaced by restart; closed once the test ends.
	ln     net.Listener
	closed bool
	conns  map[net.Conn]bool
	// cuts are the places, in order, where the next answers are cut: the
	// first one whose pattern shows up in an answer ends that connection.
	cuts []cut
	// unavailable answers that many next connections with a 503 itself.
	unavailable int
}

// cut is a place in an answer: the answer is forwarded up to offset bytes
// into the first occurrence of pattern, then the connection is closed
// (or, when stall, left open and silent).
type cut struct {
	pattern []byte
	offset  int
	stall   bool
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.accept(ln)
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.closed = true
		p.ln.Close()
		for c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *faultProxy) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.ln.Addr().String()
}

// restart is a restart of the service behind the proxy: every connection
// is cut, and new ones are refused for down, after which the proxy
// listens again on its address.
func (p *faultProxy) restart(t *testing.T, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	addr := p.ln.Addr().String()
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
	time.AfterFunc(down, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			return
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listening again on %s: %v", addr, err)
			return
		}
		p.ln = ln
		go p.accept(ln)
	})
}

// cutAnswers queues places where answers are cut.
func (p *faultProxy) cutAnswers(cuts ...cut) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, cuts...)
}

// clearCuts drops the cuts not made yet.
func (p *faultProxy) clearCuts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = nil
}

// loseNextAnswer cuts the next answer before its first byte: the server
// acted on the request, the client never hears of it.
func (p *faultProxy) loseNextAnswer() { p.cutAnswers(cut{pattern: []byte("HTTP/1.1 ")}) }

// answerUnavailable makes the proxy answer the next n connections with a
// 503 of its own, as a load balancer does while its backend is away.
func (p *faultProxy) answerUnavailable(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unavailable = n
}

func (p *faultProxy) accept(ln net.Listener) {
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.unavailable > 0 {
			p.unavailable--
			p.mu.Unlock()
			go answer503(in)
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		go p.forward(out, in)
		go p.forwardAnswer(in, out)
	}
}

func answer503(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = conn.Read(make([]byte, 64<<10)) // the request (its start is enough)
	body := "backend unavailable"
	_, _ = io.WriteString(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 19\r\n\r\n"+body)
}

// forward copies the request direction.
func (p *faultProxy) forward(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// forwardAnswer copies the answer direction, cutting it at the first
// queued cut whose pattern appears.
func (p *faultProxy) forwardAnswer(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	var tail []byte // the last bytes forwarded, where a pattern may begin
	for {
		n, err := src.Read(buf)
		data := buf[:n]
		if c, ok := p.nextCut(); ok && n > 0 {
			seen := append(append([]byte(nil), tail...), data...)
			if i := bytes.Index(seen, c.pattern); i >= 0 {
				p.popCut()
				if upTo := i + c.offset - len(tail); upTo > 0 {
					_, _ = dst.Write(data[:upTo])
				}
				if c.stall {
					// Silent but open: only the client can tell it is dead.
					_, _ = io.Copy(io.Discard, src)
				}
				return
			}
			tail = seen[max(0, len(seen)-len(c.pattern)):]
		}
		if n > 0 {
			if _, werr := dst.Write(data); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *faultProxy) nextCut() (cut, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.cuts) == 0 {
		return cut{}, false
	}
	return p.cuts[0], true
}

func (p *faultProxy) popCut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = p.cuts[1:]
}
