package api

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// defaultMaxConnections is half the process's open-file limit (no bound
// when the limit cannot be read): the other half stays for the database
// pool, Temporal, the work's outbound requests and files.
func defaultMaxConnections() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return -1
	}
	return int(max(min(lim.Cur/2, 1<<30), 1))
}

// connLimit holds a server to at most max open connections
// (Config.MaxConnections). At the bound, a new connection takes the place
// of the one idle the longest between two requests — closed, as net/http
// closes idle connections when it shuts down — and waits only while every
// connection is busy. Without that, kept-alive connections, each cheap to
// keep (one request every IdleTimeout), would fill the bound and leave
// every other client, /healthz included, waiting to be accepted.
//
// The listener it wraps accepts first and then takes a place: a waiting
// client is known to be there before an idle one is closed for it, and the
// server holds at most one connection past the bound (the one waiting).
type connLimit struct {
	places chan struct{} // one token per open connection
	done   chan struct{} // closed with the listener
	idled  chan struct{} // told (without blocking) when a connection turns idle

	mu   sync.Mutex
	idle list.List // of *limitedConn, idle the longest first

	closedIdle, waited prometheus.Counter
}

func newConnLimit(max int, m *httpMetrics) *connLimit {
	return &connLimit{places: make(chan struct{}, max), done: make(chan struct{}), idled: make(chan struct{}, 1),
		closedIdle: m.atLimit.WithLabelValues("closed_idle"), waited: m.atLimit.WithLabelValues("waited")}
}

// listener wraps ln so that its connections take places.
func (l *connLimit) listener(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, limit: l}
}

// connState follows a connection's state (http.Server.ConnState): idle
// ones may be closed to make room.
func (l *connLimit) connState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.idleAt != nil {
		l.idle.Remove(lc.idleAt)
		lc.idleAt = nil
	}
	if state == http.StateIdle {
		lc.idleAt = l.idle.PushBack(lc)
		// (a connection waiting in take for a place takes this one's)
		select {
		case l.idled <- struct{}{}:
		default:
		}
	}
}

// take takes a place for a new connection, making one if need be: it
// closes the connection idle the longest, or waits while every one is busy
// — until one closes, or turns idle and is closed for it.
func (l *connLimit) take() bool {
	waited := false
	for {
		select {
		case l.places <- struct{}{}:
			return true
		default:
		}
		l.mu.Lock()
		oldest := l.idle.Front()
		if oldest != nil {
			lc := l.idle.Remove(oldest).(*limitedConn)
			lc.idleAt = nil
			l.mu.Unlock()
			l.closedIdle.Inc()
			// Its place is given back at once; net/http's read of the next
			// request fails and it forgets the connection. A request that raced in
			// meanwhile is lost as on any idle close; clients retry those
			// (Go's transport does for idempotent ones and Idempotency-Keys).
			_ = lc.Close()
			continue
		}
		l.mu.Unlock()
		if !waited {
			waited = true
			l.waited.Inc()
		}
		select {
		case l.places <- struct{}{}:
			return true
		case <-l.idled:
		case <-l.done:
			return false
		}
	}
}

type limitedListener struct {
	net.Listener
	limit     *connLimit
	closeOnce sync.Once
}

func (ln *limitedListener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if !ln.limit.take() {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return &limitedConn{Conn: c, limit: ln.limit}, nil
}

func (ln *limitedListener) Close() error {
	err := ln.Listener.Close()
	ln.closeOnce.Do(func() { close(ln.limit.done) })
	return err
}

// limitedConn gives its place back when closed.
type limitedConn struct {
	net.Conn
	limit     *connLimit
	idleAt    *list.Element // in limit.idle while idle; guarded by limit.mu
	closeOnce sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.limit.mu.Lock()
		if c.idleAt != nil {
			c.limit.idle.Remove(c.idleAt)
			c.idleAt = nil
		}
		c.limit.mu.Unlock()
		<-c.limit.places
	})
	return err
}

// CloseWrite lets net/http half-close a connection it refuses (a 413, a
// 408) so that the client reads the answer before the reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
