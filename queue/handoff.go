package queue

import (
	"context"
	"errors"
	"time"
)

// releaseTimeout bounds a stop's release of the messages it did not send.
const releaseTimeout = 5 * time.Second

// Handoff is a signal message written by EnqueueForHandoff, for the
// dispatcher that wrote it to send once its transaction has committed.
type Handoff struct {
	m claimed
	// leaseEnd is when, at the latest, the message's lease ends by this
	// process's clock (taken before the insert, whose lease starts later).
	leaseEnd time.Time
}

// EnqueueForHandoff writes a signal message in q's transaction for this
// dispatcher to send right after the commit, handed over by Handoff: no
// NOTIFY (Postgres serialises the commits of all notifying transactions
// on one lock) and no claim (the message is written already claimed, hidden
// from every dispatcher for HandoffLease). Should this process die before
// the send, or the handoff be dropped, another dispatcher's due-poll finds
// the message once that lease ends.
//
// It returns the message and a handoff to pass to Handoff after the commit
// — never before, and not if the transaction rolls back. The handoff is nil
// when the key named an existing message (left to whatever path it is on)
// or when the dispatcher is not running: then the message is written as
// Enqueue writes it, NOTIFY included, for any replica's dispatcher.
func (d *Dispatcher) EnqueueForHandoff(ctx context.Context, q Querier, p EnqueueParams) (Message, *Handoff, error) {
	if p.Signal == nil {
		return Message{}, nil, errors.New("queue: only a signal message can be handed off")
	}
	if !d.life.Running() {
		m, _, err := Enqueue(ctx, q, p)
		return m, nil, err
	}
	leaseEnd := time.Now().Add(d.cfg.HandoffLease)
	m, created, err := insert(ctx, q, p, &d.cfg.HandoffLease)
	if err != nil || !created {
		return m, nil, err
	}
	return m, &Handoff{m: claimed{Message: m, handoffLeaseEnd: leaseEnd}, leaseEnd: leaseEnd}, nil
}

// Handoff queues h's message, whose transaction has committed, for sending
// at once through the dispatcher's send and settle pipeline (the same
// bounded concurrency as claimed messages). It never blocks: when the
// dispatcher is stopped or its handoff queue is full it drops h and reports
// false, and the message is sent after its lease like a lost handoff.
func (d *Dispatcher) Handoff(h *Handoff) bool {
	d.handoffMu.Lock()
	defer d.handoffMu.Unlock()
	if h == nil || d.handoffsClosed || !d.life.Running() {
		d.metrics.handoffs.WithLabelValues("dropped").Inc()
		return false
	}
	select {
	case d.handoffs <- h:
		return true
	default:
		d.metrics.handoffs.WithLabelValues("dropped").Inc()
		return false
	}
}

// releaseHandoffs is the stop's last look at the handoff queue: the
// messages still waiting there were written claimed, hidden for their
// lease, so each is made due again at once for any dispatcher (unclaim) —
// rather than left hidden, which held those wakes back by HandoffLease at
// every rolling restart under load. Handoffs after this are dropped.
func (d *Dispatcher) releaseHandoffs(ctx context.Context) {
	d.handoffMu.Lock()
	d.handoffsClosed = true
	var msgs []claimed
	for more := true; more; {
		select {
		case h := <-d.handoffs:
			msgs = append(msgs, h.m)
		default:
			more = false
		}
	}
	d.handoffMu.Unlock()
	if len(msgs) == 0 {
		return
	}
	released, err := d.unclaim(ctx, msgs)
	if err != nil {
		d.metrics.handoffs.WithLabelValues("dropped").Add(float64(len(msgs)))
		d.cfg.Logger.Warn("releasing handed-off signals at stop failed; they are sent after their lease", "count", len(msgs), "error", err.Error())
		return
	}
	d.metrics.handoffs.WithLabelValues("released").Add(float64(released))
	d.cfg.Logger.Info("released handed-off signals at stop for any dispatcher", "count", released)
}

// takeHandoffs moves handed-off messages into the pipeline while it has
// room under BatchSize, until ctx ends. A message whose lease has too
// little left for one send is left to the due-poll, so that it is not sent
// by this dispatcher and another at once.
func (p *pipeline) takeHandoffs(ctx context.Context) {
	for {
		for p.free() <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.handoffRoom:
			}
		}
		select {
		case <-ctx.Done():
			return
		case h := <-p.d.handoffs:
			if time.Until(h.leaseEnd) <= p.d.cfg.SendTimeout {
				p.d.metrics.handoffs.WithLabelValues("expired").Inc()
				continue
			}
			p.start([]claimed{h.m}) // (its fate is counted there)
		}
	}
}
