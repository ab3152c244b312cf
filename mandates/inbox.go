package mandates

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
)

// Every change of a request's state is an event of the approvals inbox
// (package inbox), appended in the transaction that makes the change: the
// request a refusal creates (requested), and its approval, denial, expiry
// or withdrawal (resolved).

// appendEvent appends an inbox event about a, as its GET route shows it
// now, in the caller's transaction. Without an inbox it does nothing.
func (s *Service) appendEvent(ctx context.Context, q db.Querier, typ string, a Approval) error {
	if s.cfg.Inbox == nil {
		return nil
	}
	body, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encoding approval request for the inbox: %w", err)
	}
	_, err = s.cfg.Inbox.Append(ctx, q, inbox.Event{OrgID: a.OrgID, Type: typ, Kind: inbox.KindMandateOverrun, ApprovalID: a.ID, Approval: body})
	return err
}

// appendRequested appends the requested event of the request a refusal
// just created in q's transaction.
func (s *Service) appendRequested(ctx context.Context, q db.Querier, orgID string, id uuid.UUID) error {
	if s.cfg.Inbox == nil {
		return nil
	}
	a, err := scanApproval(q.QueryRow(ctx, qGetApproval, orgID, id, AnyAgent))
	if err != nil {
		return fmt.Errorf("reading the new approval request: %w", err)
	}
	return s.appendEvent(ctx, q, inbox.TypeRequested, a)
}

// refusal names the approval request a refused spend created.
type refusal struct {
	orgID string
	id    uuid.UUID
}

// appendRequestedAll appends the requested events of the requests refusals
// created in tx's transaction, in the order given, in two round trips
// however many: the requests read, then the events appended (a group of
// refusals, one after another, held the group's locks across two round
// trips each).
func (s *Service) appendRequestedAll(ctx context.Context, tx db.Batcher, refusals []refusal) error {
	if s.cfg.Inbox == nil || len(refusals) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range refusals {
		b.Queue(qGetApproval, r.orgID, r.id, AnyAgent)
	}
	br := tx.SendBatch(ctx, b)
	evs := make([]inbox.Event, 0, len(refusals))
	for range refusals {
		a, err := scanApproval(br.QueryRow())
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("reading the new approval request: %w", err)
		}
		body, err := json.Marshal(a)
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("encoding approval request for the inbox: %w", err)
		}
		evs = append(evs, inbox.Event{OrgID: a.OrgID, Type: inbox.TypeRequested, Kind: inbox.KindMandateOverrun, ApprovalID: a.ID, Approval: body})
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("reading the new approval requests: %w", err)
	}
	_, err := s.cfg.Inbox.AppendAll(ctx, tx, evs)
	return err
}

// AppendRequestedAll appends the inbox events of the requests the refusals
// among qs created (res[i] is qs[i]'s result, decided through QueueSpend),
// for a caller that decided them in one transaction: call it there, after
// the results are read and before commit. Two round trips however many
// refusals; granted spends append nothing.
func AppendRequestedAll(ctx context.Context, tx db.Batcher, qs []*QueuedSpend, res []SpendResult) error {
	var refusals []refusal
	for i, q := range qs {
		if !res[i].OK {
			refusals = append(refusals, refusal{q.p.OrgID, res[i].ApprovalID})
		}
	}
	if len(refusals) == 0 {
		return nil
	}
	return qs[0].s.appendRequestedAll(ctx, tx, refusals)
}

// decideInTx sends b's decisions after a BEGIN, in one round trip on a
// connection of its own, hands the results to read, then lets then write
// in the same transaction (the inbox events of refusals) and commits. A
// refusal's request and its event thus commit together, at the price of
// the COMMIT's own round trip.
func decideInTx(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch, read func(pgx.BatchResults) error, then func(db.Batcher) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquiring a connection: %w", err)
	}
	defer conn.Release()
	defer rollbackOpen(ctx, conn)
	full := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)}
	full.Queue("BEGIN")
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	br := conn.SendBatch(ctx, full)
	_, err = br.Exec()
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// (joined as a transaction: code that joins a pgx.Tx, as an approval
	// webhook's enqueue does, would begin and commit its own on the bare
	// connection, committing the batch half done)
	if err := then(db.JoinedTx(conn.Conn())); err != nil {
		return err
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		return fmt.Errorf("committing spend: %w", err)
	}
	return nil
}

// rollbackOpen ends a transaction a failure left open on conn; a
// connection that cannot is closed, so the pool drops it.
func rollbackOpen(ctx context.Context, conn *pgxpool.Conn) { db.RollbackOpen(ctx, conn.Conn()) }
