package streams

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/reveille/reveille/internal/apperr"
)

// tailPage bounds the chunks one Tail.Next reads (bytes are bounded by
// MaxRequest as well).
const tailPage = 256

// Tail follows one stream live from an index: it reads what is stored, then
// what each commit adds, until the stream is closed and fully read.
//
//	for {
//		b, err := t.Next(ctx)
//		// … use b.Chunks; stop when b.Ended
//		if !b.More { select { case <-t.Ready(): case <-t.Done(): … } }
//	}
type Tail struct {
	svc            *Service
	org, run, name string
	next           int64
	sub            *Subscription
	// stream is the stream row the tail follows, once a read or its inbox
	// named it: a stream purged and written again under the same name is
	// another one, which the tail must not go on with.
	stream uuid.UUID
	// known is the highest index known of that stream (its reads' tails;
	// -1: none): the subscription's hint also counts a new stream's.
	known int64
}

// Batch is what one Tail.Next read.
type Batch struct {
	Chunks []Chunk
	// More: chunks beyond these are stored already; call Next again
	// without waiting.
	More bool
	// Ended: the stream is closed and every chunk up to TailIndex was read
	// — or retention purged it before the tail read it all: TailIndex is
	// then at or past the tail's position, and the chunks from there to it
	// are lost.
	Ended bool
	// TailIndex is the stream's last index as far as known (-1: none).
	TailIndex int64
}

// Tail subscribes to the stream (org, runID, name) and returns a Tail
// positioned at index from (MaxIndex+1: after the last chunk a stream can
// hold, where a reader that saw it resumes). The stream need not exist
// yet. Close it when done; it gives ErrStopped when the hub is not
// running.
func (s *Service) Tail(org, runID, name string, from int64) (*Tail, error) {
	if err := validateKey(runID, name); err != nil {
		return nil, err
	}
	if from < 0 || from > MaxIndex+1 {
		return nil, apperr.Invalid("start_index", fmt.Sprintf("must be a chunk index from 0 to %d", int64(MaxIndex+1)))
	}
	sub, err := s.hub.Subscribe(org, runID, name)
	if err != nil {
		return nil, err
	}
	return &Tail{svc: s, org: org, run: runID, name: name, next: from, sub: sub, known: -1}, nil
}

// Next returns what was committed from the tail's position without
// waiting: chunks this process appended come from the subscription's inbox;
// the table is read only when a notification (or staleness) says it holds
// more.
func (t *Tail) Next(ctx context.Context) (Batch, error) {
	if got, stream := t.sub.takeOf(t.stream, t.next, tailPage); len(got) > 0 {
		if t.stream == uuid.Nil {
			t.stream = stream
		}
		t.next = got[len(got)-1].Index + 1
		return Batch{Chunks: got, More: t.sub.pending(t.next), TailIndex: t.next - 1}, nil
	}
	committed := t.sub.committed() // before the read: it must see these
	if !t.sub.needsRead(t.next) {
		return Batch{TailIndex: t.next - 1}, nil
	}
	page, stream, err := t.svc.read(ctx, t.org, t.run, t.name, t.next, tailPage)
	if err != nil {
		t.sub.markStale() // read again next time
		return Batch{}, err
	}
	if t.stream != uuid.Nil && stream != t.stream {
		// The stream the tail followed is gone — only retention deletes a
		// stream, once closed — and perhaps another of the same name was
		// written since: the tail ends as for a purge (at its position
		// when it had every chunk it knew of), never waiting on a stream
		// that is gone nor going on with a new one's chunks as its own.
		// (What the hint counts is the new stream's too, once there is one.)
		end := max(t.known, t.next-1)
		if stream == uuid.Nil {
			end = max(end, committed)
		}
		return Batch{Ended: true, TailIndex: end}, nil
	}
	if len(page.Items) == 0 && (page.HasMore || committed >= t.next) {
		// Chunk t.next was committed (the row counts it, or it was known
		// before this read began) and is gone: only retention deletes
		// chunks, those of a closed stream, and the stream with them. Nothing
		// more will come: the tail ends, at a TailIndex at or past its
		// position, which tells its reader that it missed chunks. (Reading
		// on would find the same, at once and for ever: a busy loop.)
		return Batch{Ended: true, TailIndex: max(page.Info.TailIndex, committed)}, nil
	}
	if stream != uuid.Nil {
		t.stream = stream
		t.known = max(t.known, page.Info.TailIndex)
	}
	t.next = page.Next
	// A page bounds the read: what it left is stored already, and the next
	// Next must read it rather than wait for a notification.
	t.sub.stored(page.Info.TailIndex)
	ended := page.Info.Done && !page.HasMore
	return Batch{
		Chunks:    page.Items,
		More:      !ended && (page.HasMore || t.sub.pending(t.next)),
		Ended:     ended,
		TailIndex: page.Info.TailIndex,
	}, nil
}

// Recheck makes the next Next read the table even without a notification.
// Notifications are sent after the commit and can be lost (the writer
// crashed in between); an idle reader that rechecks now and then (the SSE
// handler does at every keep-alive) bounds how long such a loss can stall
// it.
func (t *Tail) Recheck() { t.sub.markStale() }

// Position is the next index the tail will read.
func (t *Tail) Position() int64 { return t.next }

// Ready receives when something may have been committed since the last
// Next (changes coalesce).
func (t *Tail) Ready() <-chan struct{} { return t.sub.Ready() }

// Done is closed when the hub stops.
func (t *Tail) Done() <-chan struct{} { return t.sub.Done() }

// Close releases the subscription. Closing twice is safe.
func (t *Tail) Close() { t.sub.Close() }
