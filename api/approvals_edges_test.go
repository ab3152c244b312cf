package api

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/retention"
)

// docs/approvals.md § Sessions and events: a session's old events are purged
// only once it has no call pending — "while one is, the session keeps all of
// its events". A call that commits while the purge runs (the purge checks
// for pending calls in its own snapshot and never takes the session's lock,
// which every writer of the session holds) loses its session's history.
func TestASessionsEventsAreNotPurgedUnderACallThatCommitsDuringThePurge(t *testing.T) {
	f := newInboxFixture(t, time.Hour)
	h, db, ctx := f.s.Handler(), f.s.svc.DB, context.Background()

	// An old, settled history: one call, answered.
	id := f.pendingToolCall(t, f.agent, "s1")
	r := do(t, h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice, map[string]any{"approval_id": id, "decision": "approved"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	_, err := db.Exec(ctx, `UPDATE session_events SET created_at = now() - interval '8 days' WHERE org_id = 'org-a' AND session_id = 's1'`)
	require.NoError(t, err)

	// A new call in the session, held just before its commit (its inbox
	// append waits for the org's event counter).
	blocker, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `UPDATE approval_event_counters SET seq = seq WHERE org_id = 'org-a'`)
	require.NoError(t, err)
	done := make(chan response, 1)
	go func() {
		done <- do(t, h, http.MethodPost, "/v1/sessions/s1/tool-calls", f.agent, map[string]any{"agent_id": "agent-1", "tool_name": "send_email"})
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the call waits before its commit")

	p, err := retention.New(db, retention.Config{Logger: f.s.cfg.Logger})
	require.NoError(t, err)
	purgeDone := make(chan error, 1)
	go func() { _, err := p.Pass(ctx); purgeDone <- err }()
	var purgeErr error
	purged := false
	select {
	case purgeErr = <-purgeDone:
		purged = true
	case <-time.After(2 * time.Second): // (a purge that waits for the session's writer is fine too)
	}
	require.NoError(t, blocker.Commit(ctx))
	call := <-done
	require.Equal(t, http.StatusOK, call.Status, "body: %s", call.Body)
	require.Equal(t, "pending", call.JSON(t)["decision"])
	if !purged {
		purgeErr = <-purgeDone
	}
	require.NoError(t, purgeErr)

	r = do(t, h, http.MethodGet, "/v1/sessions/s1/events", f.alice, nil)
	require.Equal(t, http.StatusOK, r.Status)
	items := r.JSON(t)["items"].([]any)
	require.Len(t, items, 3, "a call is pending: the session keeps all of its events: %s", r.Body)
}

// docs/approvals.md § Answers: "a token without sub, or bound to an agent
// (agent_id claim), never answers (403) — and, for the same reason, never
// sets or deletes a standing policy (which would approve its future calls
// in advance)". The policy routes refuse bound tokens only: an admin token
// without sub sets (and deletes) a standing policy, recorded with
// updated_by "".
func TestATokenWithoutSubNeverSetsOrDeletesAStandingPolicy(t *testing.T) {
	f := newApprovalsFixture(t)
	noSubAdmin := subToken(t, "org-a", "", "", RoleAdmin, RoleAgent)
	do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", noSubAdmin, map[string]any{"approval": "always"}).
		requireProblem(t, http.StatusForbidden)
	require.Zero(t, countRows(t, f.db, `SELECT count(*) FROM tool_policies`), "no policy was set")

	r := do(t, f.h, http.MethodPut, "/v1/agents/agent-1/tool-policies/shell", f.admin, map[string]any{"approval": "never"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	do(t, f.h, http.MethodDelete, "/v1/agents/agent-1/tool-policies/shell", noSubAdmin, nil).requireProblem(t, http.StatusForbidden)
	require.Equal(t, 1, countRows(t, f.db, `SELECT count(*) FROM tool_policies`), "the policy stands")
}

// An answer that only sets the standing policy (nothing pending) still
// leaves its trace in the session, as SPEC §7 appends tool.approval.resolved
// {tool_name, decision, updated_policy} on every answer — with approval_id
// null, and no turn.tool_call.denied for a denial, as no call was denied.
// It appended nothing. Found by review.
func TestAnAnswerThatOnlySetsAPolicyAppendsItsResolvedEvent(t *testing.T) {
	f := newApprovalsFixture(t)
	f.toolCall(t, f.agent, "s1", map[string]any{"agent_id": "agent-1", "tool_name": "shell"}) // the session, seq 1
	for i, decision := range []string{"approved", "denied"} {
		r := do(t, f.h, http.MethodPost, "/v1/sessions/s1/tool-approvals", f.alice,
			map[string]any{"tool_name": "git", "decision": decision, "update_policy": "always"})
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		require.Equal(t, map[string]any{"resolved": []any{}, "policy": "always"}, r.JSON(t))

		r = do(t, f.h, http.MethodGet, fmt.Sprintf("/v1/sessions/s1/events?after=%d", 1+i), f.alice, nil)
		require.Equal(t, http.StatusOK, r.Status)
		items := r.JSON(t)["items"].([]any)
		require.Len(t, items, 1, "one event, no turn.tool_call.denied: %s", r.Body)
		ev := items[0].(map[string]any)
		require.Equal(t, "tool.approval.resolved", ev["name"])
		require.Equal(t, map[string]any{"approval_id": nil, "tool_name": "git", "decision": decision,
			"source": "human", "updated_policy": "always"}, ev["payload"])
	}
}
