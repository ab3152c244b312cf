package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/leader"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/workflows/signals"
)

// The two axes (reference 004): the decision answers this call only; the
// policy, when given, decides future calls.
func TestADecisionAnswersThisCallAndUpdatePolicySetsTheNextOnesIndependently(t *testing.T) {
	for _, decision := range []string{DecisionApproved, DecisionDenied} {
		for _, update := range []string{"", PolicyAlways, PolicyOnce, PolicyNever} {
			t.Run(fmt.Sprintf("%s with update_policy %q", decision, update), func(t *testing.T) {
				s, _ := newTestService(t)
				first := request(t, s, "shell", `{"cmd":"ls"}`)
				require.Equal(t, DecisionPending, first.Decision)

				res, err := respond(s, RespondParams{ToolName: "shell", Decision: decision, UpdatePolicy: update})
				require.NoError(t, err)
				require.Equal(t, []uuid.UUID{first.Approval.ID}, res.Resolved)
				if update == "" {
					require.Nil(t, res.Policy, "no policy was set")
				} else {
					require.Equal(t, update, *res.Policy)
				}

				a, err := s.Get(context.Background(), org, first.Approval.ID, "")
				require.NoError(t, err)
				require.Equal(t, decision, a.Status, "the decision answers this call")
				require.Equal(t, SourceHuman, a.Source)
				require.Equal(t, "alice", a.ResolvedBy)

				// The next call follows the policy, not the decision.
				next := request(t, s, "shell", `{"cmd":"ls"}`)
				wantNext := map[string]string{"": DecisionPending, PolicyOnce: DecisionPending, PolicyAlways: DecisionApproved, PolicyNever: DecisionDenied}[update]
				require.Equal(t, wantNext, next.Decision)

				var updated any
				if update != "" {
					updated = update
				}
				resolvedEvent := namedEvent{EventResolved, map[string]any{"approval_id": first.Approval.ID.String(), "tool_name": "shell",
					"decision": decision, "source": SourceHuman, "updated_policy": updated}}
				want := []namedEvent{
					{EventRequested, map[string]any{"approval_id": first.Approval.ID.String(), "tool_name": "shell", "input": map[string]any{"cmd": "ls"}}},
					resolvedEvent,
				}
				if decision == DecisionDenied {
					want = append(want, namedEvent{EventDenied, map[string]any{"approval_id": first.Approval.ID.String(), "tool_name": "shell"}})
				}
				evs := eventsOf(t, s, sess)
				require.Equal(t, want, evs[:len(want)])
				if wantNext == DecisionPending {
					require.Equal(t, EventRequested, evs[len(want)].Name)
				} else {
					require.Equal(t, namedEvent{EventResolved, map[string]any{"approval_id": next.Approval.ID.String(), "tool_name": "shell",
						"decision": wantNext, "source": SourcePolicy}}, evs[len(want)])
				}
				require.Len(t, evs, len(want)+1)
			})
		}
	}
}

// Policies decide in SPEC §7's order: a matching never, then a matching
// always, then the unconditional policy, then once.
func TestPoliciesDecideWithoutAHumanInTheSpecsOrder(t *testing.T) {
	cases := []struct {
		name     string
		policies [][2]string // approval, match ("" unconditional)
		input    string
		want     string
	}{
		{name: "no policy asks", want: DecisionPending},
		{name: "always approves", policies: [][2]string{{PolicyAlways, ""}}, want: DecisionApproved},
		{name: "never denies", policies: [][2]string{{PolicyNever, ""}}, want: DecisionDenied},
		{name: "once asks", policies: [][2]string{{PolicyOnce, ""}}, want: DecisionPending},
		{name: "a matching conditional policy decides", policies: [][2]string{{PolicyAlways, `{"repo":"acme/docs"}`}},
			input: `{"repo":"acme/docs","branch":"main"}`, want: DecisionApproved},
		{name: "a non-matching conditional policy does not", policies: [][2]string{{PolicyAlways, `{"repo":"acme/docs"}`}},
			input: `{"repo":"acme/prod"}`, want: DecisionPending},
		{name: "a call without input matches no conditional policy", policies: [][2]string{{PolicyAlways, `{"repo":"acme/docs"}`}},
			want: DecisionPending},
		{name: "a non-matching conditional policy leaves it to the unconditional one",
			policies: [][2]string{{PolicyNever, `{"repo":"acme/prod"}`}, {PolicyAlways, ""}}, input: `{"repo":"acme/docs"}`, want: DecisionApproved},
		{name: "an unconditional always beats a matching conditional once",
			policies: [][2]string{{PolicyAlways, ""}, {PolicyOnce, `{"repo":"acme/prod"}`}}, input: `{"repo":"acme/prod"}`, want: DecisionApproved},
		{name: "an unconditional never beats a matching conditional once",
			policies: [][2]string{{PolicyNever, ""}, {PolicyOnce, `{"repo":"acme/prod"}`}}, input: `{"repo":"acme/prod"}`, want: DecisionDenied},
		{name: "a matching conditional once without an unconditional policy asks",
			policies: [][2]string{{PolicyOnce, `{"repo":"acme/prod"}`}}, input: `{"repo":"acme/prod"}`, want: DecisionPending},
		{name: "a matching conditional always beats an unconditional never",
			policies: [][2]string{{PolicyNever, ""}, {PolicyAlways, `{"repo":"acme/docs"}`}}, input: `{"repo":"acme/docs"}`, want: DecisionApproved},
		{name: "a matching never beats a matching always",
			policies: [][2]string{{PolicyAlways, `{"repo":"acme/docs"}`}, {PolicyNever, `{"branch":"main"}`}},
			input:    `{"repo":"acme/docs","branch":"main"}`, want: DecisionDenied},
		{name: "a matching always beats a matching once",
			policies: [][2]string{{PolicyAlways, `{"repo":"acme/docs"}`}, {PolicyOnce, `{"branch":"main"}`}},
			input:    `{"repo":"acme/docs","branch":"main"}`, want: DecisionApproved},
		{name: "a matching never beats an unconditional always",
			policies: [][2]string{{PolicyAlways, ""}, {PolicyNever, `{"branch":"main"}`}},
			input:    `{"branch":"main"}`, want: DecisionDenied},
		{name: "containment is deep", policies: [][2]string{{PolicyAlways, `{"opts":{"dry_run":true}}`}},
			input: `{"opts":{"dry_run":true,"v":2}}`, want: DecisionApproved},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, db := newTestService(t)
			for _, p := range tc.policies {
				setPolicy(t, s, "git", p[0], p[1])
			}
			res := request(t, s, "git", tc.input)
			require.Equal(t, tc.want, res.Decision)
			pending := count(t, db, `SELECT count(*) FROM tool_approvals WHERE status = 'pending'`)
			if tc.want == DecisionPending {
				require.Equal(t, 1, pending)
				require.Empty(t, res.Source)
				return
			}
			require.Zero(t, pending, "a policy's decision leaves no pending request")
			require.Equal(t, SourcePolicy, res.Source)
			require.NotNil(t, res.Policy)
			require.Equal(t, map[string]string{DecisionApproved: PolicyAlways, DecisionDenied: PolicyNever}[tc.want], res.Policy.Approval)
			require.Equal(t, SourcePolicy, res.Approval.Source)
		})
	}
}

func TestAPolicyIsOnePerToolAndMatchAndCanBeDeleted(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	a := setPolicy(t, s, "git", PolicyAlways, `{"repo":"acme/docs","branch":"main"}`)
	b := setPolicy(t, s, "git", PolicyNever, `{"branch": "main",  "repo":"acme/docs"}`) // the same match, spelled otherwise
	require.Equal(t, a.ID, b.ID)
	require.Equal(t, PolicyNever, b.Approval)
	setPolicy(t, s, "git", PolicyOnce, "")
	list, next, err := s.ListPolicies(ctx, org, agent, Page{})
	require.NoError(t, err)
	require.Nil(t, next)
	require.Len(t, list, 2)

	require.NoError(t, s.DeletePolicy(ctx, org, agent, "git", json.RawMessage(`{"repo":"acme/docs","branch":"main"}`)))
	require.ErrorIs(t, s.DeletePolicy(ctx, org, agent, "git", json.RawMessage(`{"repo":"acme/docs","branch":"main"}`)), ErrPolicyNotFound)
	require.NoError(t, s.DeletePolicy(ctx, org, agent, "git", nil))
	require.ErrorIs(t, s.DeletePolicy(ctx, org, agent, "git", nil), ErrPolicyNotFound)
	require.ErrorIs(t, s.DeletePolicy(ctx, "org-b", agent, "git", nil), ErrPolicyNotFound)
}

// A match as long as its limit (4 KiB) is stored beside the longest agent
// id, and still keys its policy by JSON value (1 and 1.0 alike). The key
// held the match itself, and a btree row holds at most 2704 bytes: such a
// match failed the upsert (a 500 over REST).
func TestALongMatchIsStoredAndStillKeysItsPolicy(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	longAgent := strings.Repeat("a", MaxText-10) + "-agent-id" // (repeats compress; the match below does not)
	rnd := rand.New(rand.NewChaCha8([32]byte{1}))              // (text Postgres cannot compress)
	noise := make([]byte, 2800)
	for i := range noise {
		noise[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[rnd.IntN(36)]
	}
	match := fmt.Sprintf(`{"n": 1, "k": %q}`, noise)
	require.Less(t, len(match), MaxMatch)
	a, err := s.PutPolicy(ctx, org, PolicyParams{AgentID: longAgent, ToolName: "git", Approval: PolicyNever, Match: json.RawMessage(match), UpdatedBy: "root"})
	require.NoError(t, err)
	b, err := s.PutPolicy(ctx, org, PolicyParams{AgentID: longAgent, ToolName: "git", Approval: PolicyAlways,
		Match: json.RawMessage(fmt.Sprintf(`{"k": %q, "n": 1.0}`, noise)), UpdatedBy: "root"})
	require.NoError(t, err)
	require.Equal(t, a.ID, b.ID, "the same match as a JSON value replaces the policy")
	require.Equal(t, PolicyAlways, b.Approval)
	c, err := s.PutPolicy(ctx, org, PolicyParams{AgentID: longAgent, ToolName: "git", Approval: PolicyOnce,
		Match: json.RawMessage(fmt.Sprintf(`{"k": %q, "n": 2}`, noise)), UpdatedBy: "root"})
	require.NoError(t, err)
	require.NotEqual(t, a.ID, c.ID, "another match is another policy")
	require.NoError(t, s.DeletePolicy(ctx, org, longAgent, "git", json.RawMessage(match)))
}

func TestSessionEventsAreNumberedWithoutGapsUnderConcurrentCallsAndAnswers(t *testing.T) {
	s, _ := newTestService(t)
	request(t, s, "warm-up", "") // the session exists, so an answer may precede its call
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(2)
		tool := fmt.Sprintf("tool-%d", i)
		go func() {
			defer wg.Done()
			_, err := s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: tool, RequestedBy: "agent-runtime"})
			errs <- err
		}()
		go func() {
			defer wg.Done()
			// The answer may come before its call: then it only sets a policy.
			_, err := respond(s, RespondParams{ToolName: tool, Decision: DecisionDenied, UpdatePolicy: PolicyOnce})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	evs := eventsOf(t, s, sess) // asserts seq = 1…N
	require.GreaterOrEqual(t, len(evs), n, "every call has its event")
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Name == EventRequested {
			id := e.Payload["approval_id"].(string)
			require.False(t, seen[id], "no duplicates")
			seen[id] = true
		}
	}
	require.Len(t, seen, n+1)
}

func TestASessionIsBoundToItsFirstAgentAndAnotherOrgsIsAbsent(t *testing.T) {
	s, _ := newTestService(t)
	request(t, s, "shell", "")
	_, err := s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: "agent-2", ToolName: "shell"})
	require.ErrorIs(t, err, ErrSessionAgent)
	require.ErrorIs(t, err, apperr.ErrConflict)

	// The same session id in another org is another session.
	_, err = s.Request(context.Background(), RequestParams{OrgID: "org-b", SessionID: sess, AgentID: "agent-2", ToolName: "shell"})
	require.NoError(t, err)
	_, _, err = s.Events(context.Background(), "org-c", sess, "", 0, 0)
	require.ErrorIs(t, err, ErrSessionNotFound)
	_, _, err = s.Events(context.Background(), org, sess, "agent-2", 0, 0)
	require.ErrorIs(t, err, ErrSessionNotFound, "another agent's session is absent to a bound reader")
	_, err = s.Respond(context.Background(), RespondParams{OrgID: "org-c", SessionID: sess, ToolName: "shell", Decision: DecisionApproved, ResolvedBy: "alice"})
	require.ErrorIs(t, err, ErrSessionNotFound)
}

// An answer that waited for the session's lock past the call's expiry is
// refused as expired: checked against its transaction's start (now()), it
// approved the expired call and recorded an answer time before the expiry.
func TestAnAnswerThatWaitedPastTheExpiryIsRefused(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	res := request(t, s, "shell", "")
	_, err := db.Exec(ctx, `UPDATE tool_approvals SET expires_at = clock_timestamp() + interval '300 milliseconds' WHERE id = $1`, res.Approval.ID)
	require.NoError(t, err)
	// Any writer of the session holds its lock.
	blocker, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `SELECT 1 FROM approval_sessions WHERE org_id = $1 AND session_id = $2 FOR UPDATE`, org, sess)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := respond(s, RespondParams{ApprovalID: res.Approval.ID, Decision: DecisionApproved})
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the answer waits for the session")
	// (past the expiry, by the database's clock)
	require.Eventually(t, func() bool {
		var past bool
		require.NoError(t, db.QueryRow(ctx, `SELECT expires_at < clock_timestamp() FROM tool_approvals WHERE id = $1`, res.Approval.ID).Scan(&past))
		return past
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, blocker.Commit(ctx))

	require.ErrorIs(t, <-done, ErrAlreadyResolved, "the call had expired when the answer got to it")
	a, err := s.Get(ctx, org, res.Approval.ID, "")
	require.NoError(t, err)
	require.Equal(t, StatusPending, a.Status, "left to the sweeper")
}

func TestAnswersAreCompareAndSetAndNeverByTheRequester(t *testing.T) {
	s, db := newTestService(t)
	mine := request(t, s, "shell", "", func(p *RequestParams) { p.RequestedBy = "alice" })
	theirs := request(t, s, "shell", "", func(p *RequestParams) { p.RequestedBy = "bob" })

	_, err := respond(s, RespondParams{ToolName: "shell", Decision: DecisionApproved, ResolvedBy: "alice"})
	require.ErrorIs(t, err, ErrSelfApproval, "by tool name: all or nothing")
	require.Equal(t, 2, count(t, db, `SELECT count(*) FROM tool_approvals WHERE status = 'pending'`))
	_, err = respond(s, RespondParams{ApprovalID: mine.Approval.ID, Decision: DecisionApproved, ResolvedBy: "alice"})
	require.ErrorIs(t, err, ErrSelfApproval)
	_, err = s.Respond(context.Background(), RespondParams{OrgID: org, SessionID: sess, ApprovalID: theirs.Approval.ID, Decision: DecisionApproved})
	require.ErrorIs(t, err, ErrNoResolver)

	res, err := respond(s, RespondParams{ApprovalID: theirs.Approval.ID, Decision: DecisionApproved, ResolvedBy: "alice"})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{theirs.Approval.ID}, res.Resolved)
	_, err = respond(s, RespondParams{ApprovalID: theirs.Approval.ID, Decision: DecisionDenied, ResolvedBy: "carol"})
	require.ErrorIs(t, err, ErrAlreadyResolved, "a second answer")

	_, err = respond(s, RespondParams{ApprovalID: mine.Approval.ID, Decision: DecisionDenied, ResolvedBy: "carol"})
	require.NoError(t, err)
	_, err = respond(s, RespondParams{ToolName: "shell", Decision: DecisionDenied, ResolvedBy: "carol"})
	require.ErrorIs(t, err, ErrNothingPending)
	res, err = respond(s, RespondParams{ToolName: "shell", Decision: DecisionDenied, UpdatePolicy: PolicyNever, ResolvedBy: "carol"})
	require.NoError(t, err, "nothing pending but a policy to set")
	require.Empty(t, res.Resolved)
	require.Equal(t, PolicyNever, *res.Policy)

	_, err = respond(s, RespondParams{ApprovalID: uuid.Must(uuid.NewV7()), Decision: DecisionDenied, ResolvedBy: "carol"})
	require.ErrorIs(t, err, ErrNotFound)
}

func TestAnAnswerQueuesTheDecisionSignalForTheWorkflowThatAsked(t *testing.T) {
	s, db := newTestService(t)
	res := request(t, s, "shell", "", func(p *RequestParams) { p.WorkflowID = org + "/wf-1"; p.RunID = "run-1" })
	require.Equal(t, &Delivery{State: DeliveryWaiting}, res.Approval.Delivery)
	require.Equal(t, signals.ApprovalSignal, res.Approval.Signal, "the default signal")
	_, err := respond(s, RespondParams{ToolName: "shell", Decision: DecisionDenied, Note: "not today"})
	require.NoError(t, err)

	msg, err := queue.GetByKey(context.Background(), db, org, Queue, res.Approval.ID.String())
	require.NoError(t, err)
	require.Equal(t, &queue.Signal{WorkflowID: org + "/wf-1", RunID: "run-1", Name: signals.ApprovalSignal}, msg.Signal)
	var d signals.Decision
	require.NoError(t, json.Unmarshal(msg.Payload, &d))
	require.Equal(t, signals.Decision{OrgID: org, ApprovalID: res.Approval.ID.String(), ToolName: "shell", Decision: DecisionDenied, Source: SourceHuman, Reason: "not today"}, d)
	a, err := s.Get(context.Background(), org, res.Approval.ID, "")
	require.NoError(t, err)
	require.Equal(t, DeliveryQueued, a.Delivery.State)

	// A policy's decision is the caller's answer: nothing to signal.
	setPolicy(t, s, "ls", PolicyAlways, "")
	res = request(t, s, "ls", "", func(p *RequestParams) { p.WorkflowID = org + "/wf-1" })
	require.Nil(t, res.Approval.Delivery)
	require.Zero(t, count(t, db, `SELECT count(*) FROM queue_messages WHERE idempotency_key = $1`, res.Approval.ID.String()))
}

func TestExpiredRequestsAreDeniedByTheSweeperWithEventsAndSignal(t *testing.T) {
	s, db := newTestService(t)
	ten := MinExpiresIn
	res := request(t, s, "shell", "", func(p *RequestParams) { p.WorkflowID = org + "/wf-1"; p.ExpiresIn = &ten })
	n, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "not yet expired")

	_, err = db.Exec(context.Background(), `UPDATE tool_approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, res.Approval.ID)
	require.NoError(t, err)
	_, err = respond(s, RespondParams{ApprovalID: res.Approval.ID, Decision: DecisionApproved})
	require.ErrorIs(t, err, ErrAlreadyResolved, "too late to answer")
	_, err = respond(s, RespondParams{ToolName: "shell", Decision: DecisionApproved})
	require.ErrorIs(t, err, ErrNothingPending, "an expired call is not answered by tool name")

	n, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	a, err := s.Get(context.Background(), org, res.Approval.ID, "")
	require.NoError(t, err)
	require.Equal(t, StatusExpired, a.Status)
	require.Equal(t, SourceExpired, a.Source)
	require.Equal(t, DecisionDenied, a.Decision())

	evs := eventsOf(t, s, sess)
	require.Equal(t, []string{EventRequested, EventResolved, EventDenied}, names(evs))
	require.Equal(t, map[string]any{"approval_id": idStr(a.ID), "tool_name": "shell", "decision": DecisionDenied, "source": SourceExpired,
		"reason": "expired", "updated_policy": nil}, evs[1].Payload)
	msg, err := queue.GetByKey(context.Background(), db, org, Queue, a.ID.String())
	require.NoError(t, err)
	var d signals.Decision
	require.NoError(t, json.Unmarshal(msg.Payload, &d))
	require.Equal(t, signals.Decision{OrgID: org, ApprovalID: a.ID.String(), ToolName: "shell", Decision: DecisionDenied, Source: SourceExpired, Reason: signals.ReasonExpired}, d)

	n, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "expired once")
}

func TestTheSweeperRunsOnItsLeader(t *testing.T) {
	s, db := newTestService(t, Config{SweepInterval: 10 * time.Millisecond, LeaderRetry: 10 * time.Millisecond})
	res := request(t, s, "shell", "")
	_, err := db.Exec(context.Background(), `UPDATE tool_approvals SET expires_at = now() WHERE id = $1`, res.Approval.ID)
	require.NoError(t, err)
	require.NoError(t, s.Start(context.Background()))
	defer func() {
		require.NoError(t, s.Stop(context.Background()))
		require.NoError(t, s.Stop(context.Background()))
	}()
	require.Eventually(t, func() bool {
		a, err := s.Get(context.Background(), org, res.Approval.ID, "")
		return err == nil && a.Status == StatusExpired
	}, 10*time.Second, 5*time.Millisecond)
}

func TestARetriedRequestWithItsKeyReturnsTheSameApproval(t *testing.T) {
	s, db := newTestService(t)
	key := func(p *RequestParams) { p.IdempotencyKey = "k1" }
	first := request(t, s, "shell", `{"a":1}`, key)
	again := request(t, s, "shell", `{ "a": 1 }`, key)
	require.Equal(t, first.Approval.ID, again.Approval.ID)
	require.Equal(t, DecisionPending, again.Decision)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM tool_approvals`))
	require.Len(t, eventsOf(t, s, sess), 1, "a replay appends nothing")
	again = request(t, s, "shell", `{"a":1.0}`, key)
	require.Equal(t, first.Approval.ID, again.Approval.ID, "1.0 is 1")
	_, err := s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(`{"a":1.0000000000000001}`), IdempotencyKey: "k1"})
	require.ErrorIs(t, err, ErrIdempotencyKeyReused, "another input, though one as float64")

	_, err = s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "other", IdempotencyKey: "k1"})
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)
	_, err = s.Request(context.Background(), RequestParams{OrgID: org, SessionID: "s-new", AgentID: agent, ToolName: "shell", IdempotencyKey: "k1"})
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM approval_sessions`), "a reused key binds no session")
}

func TestARetriedRequestMustAskForTheSameWait(t *testing.T) {
	s, _ := newTestService(t)
	hour := time.Hour
	first := request(t, s, "shell", `{}`, func(p *RequestParams) { p.IdempotencyKey = "k1"; p.ExpiresIn = &hour })
	again := request(t, s, "shell", `{}`, func(p *RequestParams) { p.IdempotencyKey = "k1"; p.ExpiresIn = &hour })
	require.Equal(t, first.Approval.ID, again.Approval.ID)
	again = request(t, s, "shell", `{}`, func(p *RequestParams) { p.IdempotencyKey = "k1" })
	require.Equal(t, first.Approval.ID, again.Approval.ID, "a retry that asks for no particular wait replays")

	minute := time.Minute
	_, err := s.Request(context.Background(), RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell",
		Input: json.RawMessage(`{}`), IdempotencyKey: "k1", ExpiresIn: &minute})
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)

	// a first call without expires_in_s waited the configured TTL: a retry
	// naming that wait is the same call
	ttl := s.cfg.TTL
	first = request(t, s, "shell", `{}`, func(p *RequestParams) { p.IdempotencyKey = "k2" })
	again = request(t, s, "shell", `{}`, func(p *RequestParams) { p.IdempotencyKey = "k2"; p.ExpiresIn = &ttl })
	require.Equal(t, first.Approval.ID, again.Approval.ID)
}

func TestBadInputNamesTheFieldAndWritesNothing(t *testing.T) {
	s, db := newTestService(t)
	big := `{"x":"` + string(make([]byte, 0)) + fmt.Sprintf("%0*d", MaxInput, 0) + `"}`
	seven := 8 * 24 * time.Hour
	nine := 9 * time.Second
	requests := []struct {
		field  string
		mutate func(*RequestParams)
	}{
		{"tool_name", func(p *RequestParams) { p.ToolName = "" }},
		{"tool_name", func(p *RequestParams) { p.ToolName = string(make([]byte, MaxToolName+1)) }},
		{"tool_name", func(p *RequestParams) { p.ToolName = "a\nb" }},
		{"session_id", func(p *RequestParams) { p.SessionID = "" }},
		{"agent_id", func(p *RequestParams) { p.AgentID = "" }},
		// path segments URL clients remove: nothing could reach them
		{"session_id", func(p *RequestParams) { p.SessionID = ".." }},
		{"session_id", func(p *RequestParams) { p.SessionID = "." }},
		{"agent_id", func(p *RequestParams) { p.AgentID = ".." }},
		{"tool_name", func(p *RequestParams) { p.ToolName = "." }},
		{"input", func(p *RequestParams) { p.Input = json.RawMessage(big) }},
		{"workflow_id", func(p *RequestParams) { p.WorkflowID = "org-b/wf" }},
		{"workflow_id", func(p *RequestParams) { p.WorkflowID = org + "/" }},
		{"run_id", func(p *RequestParams) { p.RunID = "r1" }},
		// What jsonb refuses, from in-process callers too (the reference
		// workflow's activity passes its input straight through).
		{"input", func(p *RequestParams) { p.Input = json.RawMessage(`{"a":"\u0000"}`) }},
		{"input", func(p *RequestParams) { p.Input = json.RawMessage(`{"a":"\ud800"}`) }},
		{"input", func(p *RequestParams) { p.Input = json.RawMessage(`{"a":1e999999999}`) }},
		{"expires_in_s", func(p *RequestParams) { p.ExpiresIn = &seven }},
		{"expires_in_s", func(p *RequestParams) { p.ExpiresIn = &nine }},
	}
	for _, tc := range requests {
		p := RequestParams{OrgID: org, SessionID: sess, AgentID: agent, ToolName: "shell"}
		tc.mutate(&p)
		_, err := s.Request(context.Background(), p)
		requireInvalid(t, err, tc.field)
	}
	policies := []struct {
		field string
		p     PolicyParams
	}{
		{"approval", PolicyParams{AgentID: agent, ToolName: "shell", Approval: "sometimes"}},
		{"approval", PolicyParams{AgentID: agent, ToolName: "shell"}},
		{"match", PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways, Match: json.RawMessage(`["a"]`)}},
		{"match", PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways, Match: json.RawMessage(`{}`)}},
		{"match", PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways, Match: json.RawMessage(`{"a":"\ud800"}`)}},
		{"tool_name", PolicyParams{AgentID: agent, Approval: PolicyAlways}},
		{"tool_name", PolicyParams{AgentID: agent, ToolName: "..", Approval: PolicyAlways}},
		{"agent_id", PolicyParams{AgentID: ".", ToolName: "shell", Approval: PolicyAlways}},
	}
	for _, tc := range policies {
		_, err := s.PutPolicy(context.Background(), org, tc.p)
		requireInvalid(t, err, tc.field)
	}
	responds := []struct {
		field string
		p     RespondParams
	}{
		{"decision", RespondParams{ToolName: "shell", Decision: "maybe"}},
		{"update_policy", RespondParams{ToolName: "shell", Decision: DecisionApproved, UpdatePolicy: "sometimes"}},
		{"tool_name", RespondParams{Decision: DecisionApproved}},
		{"approval_id", RespondParams{ToolName: "shell", ApprovalID: uuid.Must(uuid.NewV7()), Decision: DecisionApproved}},
	}
	for _, tc := range responds {
		_, err := respond(s, tc.p)
		requireInvalid(t, err, tc.field)
	}
	for _, table := range []string{"approval_sessions", "session_events", "tool_policies", "tool_approvals"} {
		require.Zero(t, count(t, db, `SELECT count(*) FROM `+table), table)
	}
}

// A token of org "acme/eu" naming "acme/eu/wf" was told the id must start
// with "acme/eu/", which it does: the detail names the rule instead.
func TestAWorkflowIDOfAnOrgHoldingASlashIsRefusedNamingTheRule(t *testing.T) {
	s, _ := newTestService(t)
	_, err := s.Request(context.Background(), RequestParams{OrgID: "acme/eu", SessionID: sess, AgentID: agent, ToolName: "shell",
		WorkflowID: "acme/eu/wf"})
	var inv *apperr.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, []apperr.FieldError{{Field: "workflow_id",
		Detail: `cannot name a workflow of org "acme/eu": an org id holding "/" owns no workflow, as a workflow id's org is what precedes its first "/"`}}, inv.Fields)
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var inv *apperr.InvalidError
	require.True(t, errors.As(err, &inv), "want invalid %s, got %v", field, err)
	var fields []string
	for _, f := range inv.Fields {
		fields = append(fields, f.Field)
	}
	require.Contains(t, fields, field)
}

// A key is the agent's own (issue 10 item 3): another agent sending the
// same key gets what it would get without it — a call of its own — and
// learns nothing about the first agent's call.
func TestAnotherAgentsIdempotencyKeyActsAsNoKey(t *testing.T) {
	s, db := newTestService(t)
	key := func(p *RequestParams) { p.IdempotencyKey = "k1" }
	first := request(t, s, "shell", `{"a":1}`, key)
	theirs := request(t, s, "shell", `{"a":1}`, key, func(p *RequestParams) { p.AgentID, p.SessionID = "agent-2", "session-2" })
	require.NotEqual(t, first.Approval.ID, theirs.Approval.ID)
	require.Equal(t, "agent-2", theirs.Approval.AgentID)
	again := request(t, s, "shell", `{"a":1}`, key, func(p *RequestParams) { p.AgentID, p.SessionID = "agent-2", "session-2" })
	require.Equal(t, theirs.Approval.ID, again.Approval.ID, "the second agent's key replays its own call")
	require.Equal(t, 2, count(t, db, `SELECT count(*) FROM tool_approvals`))
}

// The workflow tells an expiry by the decision's source, so an approver
// whose note happens to read "expired" does not make a denial look like
// one nobody answered.
func TestAHumansNoteNeverPassesForAnExpiry(t *testing.T) {
	s, db := newTestService(t)
	res := request(t, s, "shell", "", func(p *RequestParams) { p.WorkflowID = org + "/wf-1" })
	_, err := respond(s, RespondParams{ToolName: "shell", Decision: DecisionDenied, Note: signals.ReasonExpired})
	require.NoError(t, err)

	msg, err := queue.GetByKey(context.Background(), db, org, Queue, res.Approval.ID.String())
	require.NoError(t, err)
	var d signals.Decision
	require.NoError(t, json.Unmarshal(msg.Payload, &d))
	require.Equal(t, SourceHuman, d.Source)
	require.False(t, d.Expired())
}

// A backslash followed by "u0000" is text, not NUL: jsonb stores it, so
// the input is accepted.
func TestAnInputHoldingAnEscapedBackslashBeforeU0000IsStored(t *testing.T) {
	s, _ := newTestService(t)
	res := request(t, s, "shell", "", func(p *RequestParams) { p.Input = json.RawMessage(`{"cmd":"echo \\u0000"}`) })
	require.JSONEq(t, `{"cmd":"echo \\u0000"}`, string(res.Approval.Input))
}

// A sweeper whose replica lost the leadership without noticing yet (another
// replica started a newer term) denies nothing, appends no event and
// queues no signal; the current leader's sweep does.
func TestADeposedLeadersSweepWritesNothing(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	res := request(t, s, "shell", "", func(p *RequestParams) { p.WorkflowID = org + "/wf-1" })
	_, err := db.Exec(ctx, `UPDATE tool_approvals SET expires_at = now() - interval '1 second' WHERE id = $1`, res.Approval.ID)
	require.NoError(t, err)
	deposed, err := leader.NewTerm(ctx, db, SweeperLeadership)
	require.NoError(t, err)
	current, err := leader.NewTerm(ctx, db, SweeperLeadership) // another replica took over
	require.NoError(t, err)

	n, err := s.Sweep(leader.WithTerm(ctx, deposed))
	require.ErrorIs(t, err, leader.ErrDeposed)
	require.Zero(t, n)
	a, err := s.Get(ctx, org, res.Approval.ID, "")
	require.NoError(t, err)
	require.Equal(t, StatusPending, a.Status)
	require.Equal(t, []string{EventRequested}, names(eventsOf(t, s, sess)))
	require.Zero(t, count(t, db, `SELECT count(*) FROM queue_messages`))

	n, err = s.Sweep(leader.WithTerm(ctx, current))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{EventRequested, EventResolved, EventDenied}, names(eventsOf(t, s, sess)))
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM queue_messages`))
}

// Each tool call tests every conditional policy's match against its input
// (jsonb @>), comparing each array element of the match with each of the
// input array's: a 4 KiB match of 2,000 elements cost a second of the
// database's time per call, and one org's calls held the connections
// every org shares (found by review). A match holds at most 8 array
// elements in all, nested ones counted.
func TestAPolicysMatchHoldsAtMostEightArrayElements(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	for _, tc := range []struct {
		match string
		ok    bool
	}{
		{`{"args":[1,2,3,4,5,6,7,8]}`, true},
		{`{"args":[1,2,3,4,5,6,7,8,9]}`, false},
		{`{"a":[1,2,3,4],"b":{"c":[5,6,7,[8]]}}`, false}, // 4 + 4 + 1
		{`{"a":[1,2,3,4],"b":{"c":[5,6,7]}}`, true},
	} {
		_, err := s.PutPolicy(ctx, org, PolicyParams{AgentID: agent, ToolName: "shell", Approval: PolicyAlways, Match: json.RawMessage(tc.match), UpdatedBy: "root"})
		if tc.ok {
			require.NoError(t, err, tc.match)
			continue
		}
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, tc.match)
		require.Equal(t, "match", inv.Fields[0].Field)
		require.Contains(t, inv.Fields[0].Detail, "at most 8 array elements")
	}
}

// An agent's tool has at most 20 policies with a match, whatever the
// concurrency of the puts; a put of an existing match at the cap replaces
// it, and the unconditional policy and other tools are not counted.
func TestAnAgentsToolHasAtMostTwentyConditionalPolicies(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	put := func(tool, match string) error {
		var m json.RawMessage
		if match != "" {
			m = json.RawMessage(match)
		}
		_, err := s.PutPolicy(ctx, org, PolicyParams{AgentID: agent, ToolName: tool, Approval: PolicyAlways, Match: m, UpdatedBy: "root"})
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 30 {
		wg.Go(func() { errs <- put("shell", fmt.Sprintf(`{"n":%d}`, i)) })
	}
	wg.Wait()
	close(errs)
	ok, refused := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrTooManyPolicies):
			refused++
		default:
			require.NoError(t, err)
		}
	}
	require.Equal(t, MaxConditionalPolicies, ok)
	require.Equal(t, 30-MaxConditionalPolicies, refused)
	list, _, err := s.ListPolicies(ctx, org, agent, Page{Limit: 100})
	require.NoError(t, err)
	require.Len(t, list, MaxConditionalPolicies)
	kept := string(list[0].Match)

	require.NoError(t, put("shell", kept), "an existing match is replaced at the cap")
	require.NoError(t, put("shell", ""), "the unconditional policy is not counted")
	require.NoError(t, put("git", `{"n":1}`), "another tool has its own")
	require.ErrorIs(t, put("shell", `{"n":"one more"}`), ErrTooManyPolicies)
	require.True(t, errors.Is(ErrTooManyPolicies, apperr.ErrConflict))
}

// A policy stored before matches were bounded to 8 array elements can be
// deleted (its match named as stored): it was a 400, so the costly match
// stayed for good and the cap's "delete one first" could not be followed.
func TestAPolicyStoredPastTheArrayBoundCanBeDeleted(t *testing.T) {
	s, db := newTestService(t)
	ctx := context.Background()
	legacy := `{"args":[1,2,3,4,5,6,7,8,9]}`
	_, err := db.Exec(ctx, `INSERT INTO tool_policies (id, org_id, agent_id, tool_name, match, approval, updated_by)
		VALUES (gen_random_uuid(), $1, $2, 'shell', $3::jsonb, 'always', 'root')`, org, agent, legacy)
	require.NoError(t, err)
	require.NoError(t, s.DeletePolicy(ctx, org, agent, "shell", json.RawMessage(legacy)))
	require.ErrorIs(t, s.DeletePolicy(ctx, org, agent, "shell", json.RawMessage(legacy)), ErrPolicyNotFound)
}

// Two matches that differ only in where their nested objects close are two
// policies. The key was match's jsonb hash (migration 00025), which ignores
// that: the second put was refused with a 409 "same key hash", and a
// database holding both could not be migrated.
func TestMatchesThatDifferOnlyInWhereTheirObjectsCloseAreTwoPolicies(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	a := setPolicy(t, s, "deploy", PolicyAlways, `{"env": {"region": "eu"}}`)
	b := setPolicy(t, s, "deploy", PolicyNever, `{"env": {}, "region": "eu"}`)
	require.NotEqual(t, a.ID, b.ID)
	c := setPolicy(t, s, "deploy", PolicyOnce, `{"region": "eu", "env": {}}`) // b's match, spelled otherwise
	require.Equal(t, b.ID, c.ID)
	list, _, err := s.ListPolicies(ctx, org, agent, Page{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, p := range list {
		got[string(p.Match)] = p.Approval
	}
	require.Equal(t, map[string]string{`{"env": {"region": "eu"}}`: PolicyAlways, `{"env": {}, "region": "eu"}`: PolicyOnce}, got)
	require.NoError(t, s.DeletePolicy(ctx, org, agent, "deploy", json.RawMessage(`{"env": {}, "region": "eu"}`)))
	list, _, err = s.ListPolicies(ctx, org, agent, Page{})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, a.ID, list[0].ID)
}
