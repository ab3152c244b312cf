package approvals

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
)

// A call that goes pending for a human, and its answer or expiry, are
// events of the approvals inbox (package inbox), appended in the
// transaction that makes the change. A call a policy decides at once never
// waits for anyone: it makes no event.

// qApprovalsByID reads tool approvals as their GET route shows them, in id
// order. $1 org, $2 ids.
const qApprovalsByID = approvalSelect + ` WHERE a.org_id = $1 AND a.id = ANY($2) ORDER BY a.id`

// appendInbox appends one inbox event of type typ for each of ids, with
// the approval as it stands in q's transaction, last in that transaction
// (the org's event counter stays locked until commit). Without an inbox it
// does nothing.
func (s *Service) appendInbox(ctx context.Context, q db.Querier, typ, orgID string, ids ...uuid.UUID) error {
	if s.cfg.Inbox == nil || len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, qApprovalsByID, orgID, ids)
	if err != nil {
		return fmt.Errorf("reading tool approvals for the inbox: %w", err)
	}
	approvals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ToolApproval, error) { return scanApproval(r) })
	if err != nil {
		return fmt.Errorf("reading tool approvals for the inbox: %w", err)
	}
	for _, a := range approvals {
		body, err := json.Marshal(a)
		if err != nil {
			return fmt.Errorf("encoding tool approval for the inbox: %w", err)
		}
		ev := inbox.Event{OrgID: orgID, Type: typ, Kind: inbox.KindToolCall, ApprovalID: a.ID, Approval: body}
		if _, err := s.cfg.Inbox.Append(ctx, q, ev); err != nil {
			return err
		}
	}
	return nil
}
