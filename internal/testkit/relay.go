package testkit

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewCuttablePool is NewPool reached through a TCP relay, and the relay's
// cut: once called, the database is out of reach — every connection the
// pool holds is broken and every new one refused — as when the server or
// the network between goes away. For tests of what callers see then,
// after the services that need the database at start have started.
func NewCuttablePool(t testing.TB) (*pgxpool.Pool, func()) {
	t.Helper()
	u, err := url.Parse(NewDatabase(t))
	if err != nil {
		t.Fatalf("testkit: parse dsn: %v", err)
	}
	r, err := newRelay(u.Host)
	if err != nil {
		t.Fatalf("testkit: relay: %v", err)
	}
	t.Cleanup(r.cut)
	u.Host = r.ln.Addr().String()
	return NewPoolFor(t, u.String()), r.cut
}

// relay copies bytes between its clients and target until cut.
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	done   bool
}

func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target}
	go r.accept()
	return r, nil
}

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // cut
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !r.track(c, up) {
			return
		}
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

// track records a relayed pair; false (both closed) once cut.
func (r *relay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	r.conns = append(r.conns, conns...)
	return true
}

func (r *relay) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src) // until either side closes, or the cut
	_ = dst.Close()
	_ = src.Close()
}

// cut closes the listener (new connections are refused) and every relayed
// connection. Safe to call twice.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	_ = r.ln.Close()
	for _, c := range r.conns {
		_ = c.Close()
	}
}
