package streams

import (
	"sync"

	"github.com/google/uuid"
)

// Bounds of a subscription's inbox. Past them the inbox is dropped and the
// subscriber reads from the table instead, so a slow reader costs memory
// only up to here (and the batches are shared by all subscribers of a
// stream).
const (
	inboxMaxBatches = 64
	inboxMaxBytes   = 1 << 20
)

// Subscription is one subscriber's interest in one stream. Besides the
// signal it keeps what it has learnt since its last read from the table:
// the highest index announced (hint), whether something happened that only
// a read can tell (stale: a close, a reconnect, an overflow), and the
// chunks this process appended meanwhile (the inbox). A reader (Tail)
// consults take and needsRead, in that order, and reads the table only
// when told to.
type Subscription struct {
	hub    *Hub
	key    streamKey
	ready  chan struct{}
	done   <-chan struct{} // the hub's Stopped
	closed sync.Once

	mu    sync.Mutex
	hint  int64
	stale bool
	inbox []inboxBatch
	bytes int
}

type inboxBatch struct {
	stream uuid.UUID // the stream row (uuid.Nil: unknown)
	first  int64
	chunks []Chunk
	size   int
}

func (b inboxBatch) last() int64 { return b.first + int64(len(b.chunks)) - 1 }

// Ready receives a value when the stream may have changed since the last
// receive; any number of changes in between coalesce into one.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Done is closed when the hub stops; the subscriber should end.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Close unsubscribes. Closing twice is safe.
func (s *Subscription) Close() {
	s.closed.Do(func() {
		h := s.hub
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[s.key], s)
		if len(h.subs[s.key]) == 0 {
			delete(h.subs, s.key)
		}
		h.metrics.subscribers.Dec()
	})
	s.mu.Lock()
	s.inbox, s.bytes = nil, 0
	s.mu.Unlock()
}

// take returns up to limit chunks from index next that this process
// published, in order and without gaps; none when the inbox does not hold
// next.
func (s *Subscription) take(next int64, limit int) []Chunk {
	got, _ := s.takeOf(uuid.Nil, next, limit)
	return got
}

// takeOf is take of the chunks of the stream row stream only (uuid.Nil:
// whichever holds next first, whose id it returns).
func (s *Subscription) takeOf(stream uuid.UUID, next int64, limit int) ([]Chunk, uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []Chunk
	for len(got) < limit {
		i := s.batchHoldingOf(stream, next)
		if i < 0 {
			break
		}
		b := s.inbox[i]
		if stream == uuid.Nil {
			stream = b.stream
		}
		n := min(b.last()-next+1, int64(limit-len(got)))
		got = append(got, b.chunks[next-b.first:next-b.first+n]...)
		next += n
	}
	kept, size := s.inbox[:0], 0
	for _, b := range s.inbox {
		if b.last() >= next {
			kept, size = append(kept, b), size+b.size
		}
	}
	clear(s.inbox[len(kept):])
	s.inbox, s.bytes = kept, size
	return got, stream
}

func (s *Subscription) batchHolding(idx int64) int { return s.batchHoldingOf(uuid.Nil, idx) }

func (s *Subscription) batchHoldingOf(stream uuid.UUID, idx int64) int {
	for i, b := range s.inbox {
		if b.first <= idx && idx <= b.last() && (stream == uuid.Nil || b.stream == uuid.Nil || b.stream == stream) {
			return i
		}
	}
	return -1
}

// needsRead reports whether the table may hold chunks from index next that
// the inbox did not, or a close; it resets staleness, as the caller reads
// now.
func (s *Subscription) needsRead(next int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	need := s.stale || s.hint >= next
	s.stale = false
	return need
}

// committed is the highest index known to be committed (a read saw it, or
// an append's notification or publication announced it): a read that
// starts after the call sees it, unless retention purged it.
func (s *Subscription) committed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hint
}

// pending reports whether anything from index next is known to be
// readable now, from the inbox or the table.
func (s *Subscription) pending(next int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stale || s.hint >= next || s.batchHolding(next) >= 0
}

// note records a notification: a close makes the subscription stale, an
// append raises the hint.
func (s *Subscription) note(closed bool, last int64) {
	s.mu.Lock()
	if closed {
		s.stale = true
	} else {
		s.hint = max(s.hint, last)
	}
	s.mu.Unlock()
	s.signal()
}

// stored records that the table holds chunks up to index last (a read
// saw it), so that the next Next reads on instead of waiting.
func (s *Subscription) stored(last int64) {
	s.mu.Lock()
	s.hint = max(s.hint, last)
	s.mu.Unlock()
}

func (s *Subscription) markStale() {
	s.mu.Lock()
	s.stale = true
	s.mu.Unlock()
	s.signal()
}

// deliver adds a published batch to the inbox, or drops the inbox when it
// would overflow.
func (s *Subscription) deliver(b inboxBatch) {
	s.mu.Lock()
	if len(s.inbox) >= inboxMaxBatches || s.bytes+b.size > inboxMaxBytes {
		clear(s.inbox)
		s.inbox, s.bytes, s.stale = s.inbox[:0], 0, true
	} else {
		s.inbox, s.bytes = append(s.inbox, b), s.bytes+b.size
	}
	s.hint = max(s.hint, b.last())
	s.mu.Unlock()
	s.signal()
}

// signal never blocks: a pending signal already covers this change.
func (s *Subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}
