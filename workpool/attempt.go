package workpool

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Result kinds of an attempt, as sqlComplete takes them.
const (
	kindSucceeded = string(OutcomeSucceeded)
	kindFailed    = string(OutcomeFailed)
	// kindHandBack: the attempt did not finish because this replica is
	// shutting down; the work goes back to pending at once, and the attempt
	// does not count.
	kindHandBack = "handback"
)

// attemptResult is how one attempt ended, as an executor (or recovery)
// reports it.
type attemptResult struct {
	id        uuid.UUID
	pool      string
	attempt   int    // 1-based
	kind      string // kindSucceeded, kindFailed or kindHandBack
	result    json.RawMessage
	err       string
	retryable bool
	hook      bool // the work has an onComplete hook (as claimed)
}

// pgUUIDs converts ids for array parameters: as [16]byte pgx encodes them
// directly, where uuid.UUID would go element by element through
// driver.Valuer (a measurable share of a report's CPU).
func pgUUIDs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// byID returns results sorted by work id (a sorted copy): statements that
// update a batch of work rows, and may wait for their locks, then take
// them in the order of the primary key, as the loop's do, rather than
// deadlock with them.
func byID(results []attemptResult) []attemptResult {
	if slices.IsSortedFunc(results, compareByID) {
		return results
	}
	sorted := slices.Clone(results)
	slices.SortFunc(sorted, compareByID)
	return sorted
}

func compareByID(a, b attemptResult) int { return bytes.Compare(a.id[:], b.id[:]) }

// hookCall is a finished item whose onComplete hook must run.
type hookCall struct {
	c        Completion
	hook     string
	attempts int // hook calls already made and failed
}

// finishedRow is a row RETURNING from the statements that record or finish
// work: its state after the statement, and (sqlComplete) the kind of result
// recorded.
type finishedRow struct {
	id       uuid.UUID
	orgID    string
	pool     string
	handler  string
	state    string
	outcome  *string
	result   json.RawMessage
	errText  *string
	attempts int32
	hook     *string
	hookCtx  json.RawMessage
	kind     string
	xid      int64 // the recording transaction (0: not reported)
}

func scanFinished(rows pgx.Rows) ([]finishedRow, error) {
	defer rows.Close()
	var out []finishedRow
	fields := rows.FieldDescriptions()
	withKind := len(fields) > 11
	withXID := len(fields) > 12 && fields[12].Name == "xid"
	for rows.Next() {
		var r finishedRow
		dest := []any{&r.id, &r.orgID, &r.pool, &r.handler, &r.state, &r.outcome, &r.result, &r.errText,
			&r.attempts, &r.hook, &r.hookCtx}
		if withKind {
			dest = append(dest, &r.kind)
		}
		if withXID {
			dest = append(dest, &r.xid)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// hookCalls picks the rows that finished and have a hook.
func hookCalls(rows []finishedRow) []hookCall {
	var calls []hookCall
	for _, r := range rows {
		if r.state != "finished" || r.hook == nil {
			continue
		}
		c := Completion{WorkID: r.id, OrgID: r.orgID, Pool: r.pool, Handler: r.handler, Attempts: int(r.attempts),
			Result: r.result, Context: r.hookCtx}
		if r.outcome != nil {
			c.Outcome = Outcome(*r.outcome)
		}
		if r.errText != nil {
			c.Error = *r.errText
		}
		calls = append(calls, hookCall{c: c, hook: *r.hook})
	}
	return calls
}
