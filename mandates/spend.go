package mandates

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
)

// SpendParams is one spend.
type SpendParams struct {
	OrgID   string
	AgentID string
	Scope   string
	// Cost in the mandate's units, ≥ 0 (0 checks authority without using it).
	Cost   int64
	Reason string
	// IdempotencyKey, when set, makes the spend happen at most once per
	// (org, agent, key): a repeat returns the first answer. Callers that reuse one
	// client key across operations should prefix it with their own name.
	IdempotencyKey string
	// RequestedBy is the principal (token sub) asking; it may not resolve the
	// approval request a refusal creates.
	RequestedBy string
	// OnResolve is stored with the approval request of a refusal and handed
	// to the resolve hook registered for its Kind.
	OnResolve *Payload
}

// SpendResult is a spend's answer.
type SpendResult struct {
	OK bool
	// Remaining is what may still be spent after this spend (after a refusal:
	// what the mandate has left, 0 when there is none).
	Remaining int64
	// MandateID is the debited mandate (when OK).
	MandateID uuid.UUID
	// ApprovalID is the approval request created by the refusal (when !OK).
	ApprovalID uuid.UUID
	// Refusal says why it was refused: no_mandate, revoked, expired or
	// insufficient (when !OK).
	Refusal string
	// Replayed is true when the answer is the stored first answer to the
	// idempotency key.
	Replayed bool
}

func (p SpendParams) validate() error {
	inv := &apperr.InvalidError{}
	requireText(inv, "agent_id", p.AgentID)
	requireText(inv, "scope", p.Scope)
	checkInputText(inv, "reason", p.Reason)
	checkInputText(inv, "idempotency_key", p.IdempotencyKey)
	checkAmount(inv, "cost", p.Cost)
	if p.OnResolve != nil && p.OnResolve.Kind == "" {
		inv.Add("on_resolve.kind", "must not be empty")
	}
	return inv.OrNil()
}

// Spend decides a spend in its own transaction and commits it before it
// returns: the debit with its ledger row, or the refusal with its approval
// request. The decision is one round trip; concurrent Spend calls share
// round trips and commits (see spendBatcher), never decisions.
func (s *Service) Spend(ctx context.Context, p SpendParams) (SpendResult, error) {
	if err := p.validate(); err != nil {
		return SpendResult{}, err
	}
	var res SpendResult
	var decided bool
	var err error
	if s.batcher != nil {
		// (the batcher counts what it decides, whether or not its caller
		// is still waiting for the answer)
		res, _, err = s.batcher.do(ctx, p)
	} else {
		res, decided, err = s.spendAlone(ctx, p)
		if err == nil && decided {
			s.metrics.spend(res.OK)
		}
	}
	if err != nil {
		return SpendResult{}, err
	}
	return res, nil
}

// SpendTx decides a spend inside the caller's transaction, so the caller's
// rows commit (or roll back) with the decision. A concurrent spend with the
// same key waits until tx ends. decided is false when p's key had been
// used, and the result is then the first answer; the caller counts a
// decision with CountSpend once tx has committed.
func (s *Service) SpendTx(ctx context.Context, tx pgx.Tx, p SpendParams) (res SpendResult, decided bool, err error) {
	return s.spend(ctx, tx, p)
}

// CountSpend counts a decision made in a caller's transaction (SpendTx,
// QueueSpend) in reveille_mandates_spends_total. Call it once that
// transaction has committed: one rolled back decided nothing, and a
// caller that runs it again would count it twice.
func (s *Service) CountSpend(res SpendResult) { s.metrics.spend(res.OK) }

// spend decides p on q in one statement: on the pool, its own implicit
// transaction. decided reports whether this call made the decision rather
// than finding the first answer to its key, which takes a second read.
func (s *Service) spend(ctx context.Context, q db.Batcher, p SpendParams) (res SpendResult, decided bool, err error) {
	if err := p.validate(); err != nil {
		return SpendResult{}, false, err
	}
	b := &pgx.Batch{}
	s.queueSpend(b, p)
	br := db.SendBatch(ctx, q, b)
	defer br.Close() // (a panic while reading: its connection goes back)
	res, decided, err = readSpend(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("committing spend: %w", cerr)
	}
	if err == nil && decided && !res.OK {
		err = s.appendRequested(ctx, q, p.OrgID, res.ApprovalID)
	}
	if err != nil || decided {
		return res, decided, err
	}
	res, err = s.answer(ctx, q, p)
	if errors.Is(err, errKeyPurged) {
		return s.spend(ctx, q, p) // past its window: decide afresh
	}
	return res, false, err
}

// spendAlone decides p in a transaction of its own. With an inbox, a
// refusal's event must commit with its request, so the decision runs in an
// explicit transaction (decideInTx); without one, in the implicit
// transaction of a single round trip.
func (s *Service) spendAlone(ctx context.Context, p SpendParams) (res SpendResult, decided bool, err error) {
	if s.cfg.Inbox == nil {
		return s.spend(ctx, s.db, p)
	}
	b := &pgx.Batch{}
	s.queueSpend(b, p)
	err = decideInTx(ctx, s.db, b, func(br pgx.BatchResults) error {
		res, decided, err = readSpend(br)
		return err
	}, func(q db.Batcher) error {
		if decided && !res.OK {
			return s.appendRequested(ctx, q, p.OrgID, res.ApprovalID)
		}
		return nil
	})
	if err != nil || decided {
		return res, decided, err
	}
	res, err = s.answer(ctx, s.db, p)
	if errors.Is(err, errKeyPurged) {
		return s.spendAlone(ctx, p) // past its window: decide afresh
	}
	return res, false, err
}

// queueSpend adds p's decision to b and returns the id the approval
// request of a refusal will have.
func (s *Service) queueSpend(b *pgx.Batch, p SpendParams) (approvalID uuid.UUID) {
	var kind string
	var data []byte
	if p.OnResolve != nil {
		kind, data = p.OnResolve.Kind, p.OnResolve.Data
		if len(data) == 0 {
			data = nil
		}
	}
	approvalID = newID()
	b.Queue(qSpendDecide, p.OrgID, p.AgentID, p.Scope, p.Cost, p.Reason, p.IdempotencyKey,
		newID(), approvalID, p.RequestedBy, s.cfg.ApprovalTTL.Microseconds(), kind, data)
	return approvalID
}

// QueuedSpend is a spend decision queued in a caller's batch by
// QueueSpend.
type QueuedSpend struct {
	// ApprovalID is the id the approval request of a refusal gets, fixed
	// before the batch is sent, so that a statement queued after the
	// decision in the same transaction can find the request (or find that
	// there is none: the spend was granted).
	ApprovalID uuid.UUID
	s          *Service
	p          SpendParams
}

// QueueSpend validates p and queues its decision in b, for a caller that
// sends b in a transaction of its own beside statements of its own (the
// wake-up gate: its intent and its spend commit together, all in one round
// trip). Read the answer with Read, in b's queue order.
func (s *Service) QueueSpend(b *pgx.Batch, p SpendParams) (*QueuedSpend, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &QueuedSpend{ApprovalID: s.queueSpend(b, p), s: s, p: p}, nil
}

// Read takes the decision from br. decided is false when p's key had been
// used before, so that nothing was decided now: Answer reads the first
// answer once br is closed.
// Once the batch's transaction has committed, count a decision with
// Service.CountSpend.
func (q *QueuedSpend) Read(br pgx.BatchResults) (res SpendResult, decided bool, err error) {
	return readSpend(br)
}

// Answer is the first answer to the key of a spend Read found already
// used, or ErrIdempotencyKeyReused when it was first used for another.
func (q *QueuedSpend) Answer(ctx context.Context, db db.Querier) (SpendResult, error) {
	return q.s.answer(ctx, db, q.p)
}

// readSpend reads one decision queued by queueSpend. decided is false when
// the key had been used: the answer is then the first one (Service.answer).
func readSpend(br pgx.BatchResults) (res SpendResult, decided bool, err error) {
	var mandateID, approvalID pgtype.UUID
	var remaining, refusedRemaining *int64
	var why *string
	if err := br.QueryRow().Scan(&decided, &mandateID, &remaining, &approvalID, &why, &refusedRemaining); err != nil {
		return SpendResult{}, false, fmt.Errorf("deciding spend: %w", err)
	}
	if !decided {
		return SpendResult{}, false, nil
	}
	res = SpendResult{OK: mandateID.Valid}
	if res.OK {
		res.MandateID, res.Remaining = mandateID.Bytes, deref(remaining)
	} else {
		res.ApprovalID, res.Refusal, res.Remaining = approvalID.Bytes, deref(why), deref(refusedRemaining)
	}
	return res, true, nil
}

// errKeyPurged is answer's error when the key a decision found has been
// purged since (internal/retention): the spend is decided afresh.
var errKeyPurged = errors.New("the spend idempotency key was purged past its window")

// answer returns the first answer to p's key, or ErrIdempotencyKeyReused
// when the key was first used for another spend.
func (s *Service) answer(ctx context.Context, q db.Querier, p SpendParams) (SpendResult, error) {
	var agentID, scope string
	var cost int64
	var reason *string
	var mandateID, approvalID pgtype.UUID
	var remaining, refusedRemaining *int64
	var why *string
	err := q.QueryRow(ctx, qSpendAnswer, p.OrgID, p.IdempotencyKey, p.AgentID).
		Scan(&agentID, &scope, &cost, &reason, &mandateID, &remaining, &approvalID, &why, &refusedRemaining)
	if errors.Is(err, pgx.ErrNoRows) {
		// (the key was there when the decision was made and retention has
		// purged it since: it was past its window)
		return SpendResult{}, errKeyPurged
	}
	if err != nil {
		return SpendResult{}, fmt.Errorf("reading the first answer to the spend idempotency key: %w", err)
	}
	if agentID != p.AgentID || scope != p.Scope || cost != p.Cost || deref(reason) != p.Reason {
		return SpendResult{}, ErrIdempotencyKeyReused
	}
	res := SpendResult{Replayed: true}
	switch {
	case mandateID.Valid:
		res.OK, res.MandateID, res.Remaining = true, mandateID.Bytes, deref(remaining)
	case approvalID.Valid:
		res.ApprovalID, res.Refusal, res.Remaining = approvalID.Bytes, deref(why), deref(refusedRemaining)
	default:
		return SpendResult{}, errors.New("reading the first answer to the spend idempotency key: neither outcome row exists")
	}
	return res, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Refund gives amount back to the mandate of (agent, scope) in its own
// transaction. See RefundTx.
func (s *Service) Refund(ctx context.Context, orgID, agentID, scope string, amount int64, reason, idempotencyKey string) error {
	return s.refund(ctx, s.db, orgID, agentID, scope, amount, reason, idempotencyKey)
}

// RefundTx writes the compensating ledger row (kind refund, amount −amount)
// and lowers spent by amount, in the caller's transaction. A repeated key
// refunds nothing again. It refuses to refund more than was spent.
func (s *Service) RefundTx(ctx context.Context, tx pgx.Tx, orgID, agentID, scope string, amount int64, reason, idempotencyKey string) error {
	return s.refund(ctx, tx, orgID, agentID, scope, amount, reason, idempotencyKey)
}

func (s *Service) refund(ctx context.Context, q db.Querier, orgID, agentID, scope string, amount int64, reason, key string) error {
	inv := &apperr.InvalidError{}
	checkAmount(inv, "amount", amount)
	checkText(inv, "reason", reason)
	checkText(inv, "idempotency_key", key)
	if err := inv.OrNil(); err != nil {
		return err
	}
	var found, refunded bool
	err := q.QueryRow(ctx, qRefund, orgID, agentID, scope, newID(), amount, reason, key).Scan(&found, &refunded)
	if err != nil {
		return fmt.Errorf("refunding: %w", err)
	}
	switch {
	case !found:
		return ErrNotFound
	case refunded:
		return nil
	case key != "":
		var replay bool
		if err := q.QueryRow(ctx, qRefundExists, orgID, key).Scan(&replay); err != nil {
			return fmt.Errorf("checking refund idempotency key: %w", err)
		}
		if replay {
			return nil
		}
	}
	return apperr.Invalid("amount", "exceeds what the mandate has spent")
}

// MaxAmount bounds costs, budgets and spent: the largest integer a JSON
// client holds exactly. A debit stays within its budget; an approved overrun
// that would take spent past MaxAmount is refused (ErrSpentBeyondMax), so
// that spent, and every sum of it, stays within it.
const MaxAmount = 1<<53 - 1

func checkAmount(inv *apperr.InvalidError, field string, v int64) {
	if v < 0 || v > MaxAmount {
		inv.Add(field, "must be an integer from 0 to 2^53−1")
	}
}

// checkText rejects what Postgres text cannot hold, so that bad input is a
// 400 and not a failed statement.
func checkText(inv *apperr.InvalidError, field, v string) {
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		inv.Add(field, "must be UTF-8 text without NUL characters")
	}
}

// checkInputText is checkText for text a caller gives: also at most
// MaxText bytes. (Not for the reasons the engine writes itself, such as a
// refund's, which may quote a caller's whole reason.)
func checkInputText(inv *apperr.InvalidError, field, v string) {
	if len(v) > MaxText {
		inv.Add(field, fmt.Sprintf("must be at most %d bytes", MaxText))
		return
	}
	checkText(inv, field, v)
}

func requireText(inv *apperr.InvalidError, field, v string) {
	if v == "" {
		inv.Add(field, "must not be empty")
		return
	}
	checkInputText(inv, field, v)
}
