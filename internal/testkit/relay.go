package testkit

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
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
	r, dsn := NewRelay(t, NewDatabase(t))
	return NewPoolFor(t, dsn), r.Cut
}

// Relay copies bytes between a test's clients and a Postgres server, and
// breaks that the ways a network does: Cut closes everything at once (the
// server sees its clients go), Silence and Partition drop bytes without a
// word (a NAT or firewall that forgot a connection, a node gone from the
// network: neither side hears of it; SilenceAt one connection from a given
// statement on), CutReplyTo loses one answer with its
// connection (the server did the work; the client cannot know).
type Relay struct {
	ln          net.Listener
	target      string
	mu          sync.Mutex
	conns       []net.Conn
	silent      map[string]bool // by the client's address
	partitioned bool
	done        bool
	replyMarker []byte          // armed by CutReplyTo
	replyCut    map[string]bool // clients whose next reply is lost
	replyCuts   atomic.Int64
	holdMarker  []byte                // armed by HoldReplyTo
	holding     *replyHold            // its hold, until a connection takes it
	holds       map[string]*replyHold // clients whose next reply is held
	muteMarker  []byte                // armed by SilenceAt
	muted       chan struct{}         // closed once a connection took it
}

// replyHold is one answer HoldReplyTo holds back.
type replyHold struct {
	arrived, release chan struct{}
	once             sync.Once
}

// NewRelay starts a relay to dsn's server and returns it with the DSN
// that reaches the server through it. It is cut when the test ends.
func NewRelay(t testing.TB, dsn string) (*Relay, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testkit: parse dsn: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: relay: %v", err)
	}
	r := &Relay{ln: ln, target: u.Host, silent: map[string]bool{}, replyCut: map[string]bool{}, holds: map[string]*replyHold{}}
	go r.accept()
	t.Cleanup(r.Cut)
	u.Host = ln.Addr().String()
	return r, u.String()
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // cut or partitioned
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !r.track(c, up) {
			return
		}
		client := c.RemoteAddr().String()
		go r.pipe(client, c, up, false)
		go r.pipe(client, up, c, true)
	}
}

// track records a relayed pair; false (both closed) once cut.
func (r *Relay) track(conns ...net.Conn) bool {
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

func (r *Relay) isSilent(client string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.partitioned || r.silent[client]
}

// pipe copies src to dst until either side closes or the cut; bytes read
// while the connection is silent are dropped, and so is its close.
// toServer is the direction: client to server.
func (r *Relay) pipe(client string, dst, src net.Conn, toServer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !toServer {
			r.holdReply(client)
		}
		if n > 0 && !toServer && r.losesReply(client) {
			_ = dst.Close()
			_ = src.Close()
			return
		}
		if n > 0 && toServer {
			r.watchForMarker(client, buf[:n])
		}
		silent := r.isSilent(client)
		if n > 0 && !silent {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if !silent {
				_ = dst.Close()
				_ = src.Close()
			}
			return
		}
	}
}

// CutReplyTo arms the loss of one answer: the next connection whose client
// sends bytes holding marker passes them on (the server runs the
// statement, and commits it outside a transaction block), and is closed as
// the server's reply comes back, unread. ReplyCuts counts those made.
func (r *Relay) CutReplyTo(marker string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replyMarker = []byte(marker)
}

// HoldReplyTo arms the holding back of one answer: the next connection
// whose client sends bytes holding marker passes them on (the server runs
// the statement, and commits it outside a transaction block), and its
// reply waits in the relay until release is called (then it goes on, to a
// client that may have given up on it meanwhile). arrived is closed once
// the reply has come back from the server.
func (r *Relay) HoldReplyTo(marker string) (arrived <-chan struct{}, release func()) {
	h := &replyHold{arrived: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holdMarker, r.holding = []byte(marker), h
	return h.arrived, func() { h.once.Do(func() { close(h.release) }) }
}

// holdReply waits while client's reply is held (HoldReplyTo).
func (r *Relay) holdReply(client string) {
	r.mu.Lock()
	h := r.holds[client]
	delete(r.holds, client)
	r.mu.Unlock()
	if h != nil {
		close(h.arrived)
		<-h.release
	}
}

// ReplyCuts is how many answers CutReplyTo has lost.
func (r *Relay) ReplyCuts() int64 { return r.replyCuts.Load() }

func (r *Relay) watchForMarker(client string, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.replyMarker != nil && bytes.Contains(b, r.replyMarker) {
		r.replyMarker = nil
		r.replyCut[client] = true
	}
	if r.holdMarker != nil && bytes.Contains(b, r.holdMarker) {
		r.holds[client], r.holdMarker, r.holding = r.holding, nil, nil
	}
	if r.muteMarker != nil && bytes.Contains(b, r.muteMarker) {
		r.silent[client], r.muteMarker = true, nil
		close(r.muted)
	}
}

func (r *Relay) losesReply(client string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.replyCut[client] {
		return false
	}
	delete(r.replyCut, client)
	r.replyCuts.Add(1)
	return true
}

// Cut closes the listener (new connections are refused) and every relayed
// connection. Safe to call twice.
func (r *Relay) Cut() {
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

// Silence makes the relayed connection whose client end is at client (the
// client's local address) go silent: nothing more passes either way and
// neither end is closed, so each side waits on the other for good.
func (r *Relay) Silence(client net.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.silent[client.String()] = true
}

// SilenceAt arms the silencing of one connection mid-conversation: the
// next connection whose client sends bytes holding marker goes silent from
// those bytes on (they never reach the server, which waits for them —
// inside a transaction, holding its locks — while the client waits for
// the answer; neither hears of the other's close). muted is closed once a
// connection took it.
func (r *Relay) SilenceAt(marker string) (muted <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.muteMarker, r.muted = []byte(marker), make(chan struct{})
	return r.muted
}

// Partition silences every relayed connection and refuses new ones, as
// when the clients' host drops off the network: nothing it sends or
// closes reaches the server any more.
func (r *Relay) Partition() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partitioned = true
	_ = r.ln.Close()
}
