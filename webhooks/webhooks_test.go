package webhooks

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/workpool"
)

// verify is what a receiver does: HMAC-SHA256 of the body it read, keyed
// with the secret it was shown, against the signature header.
func verify(secret string, d delivery) bool {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(d.body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	return hmac.Equal([]byte(want), []byte(d.header.Get(HeaderSignature)))
}

func TestAJSONWebhookReceivesBothEventsSignedWithTheSecretShownAtCreation(t *testing.T) {
	f := newFixture(t)
	rcv := newReceiver(t, 0)
	created := f.put(t, orgA, "ops", rcv.srv.URL+"/hook", FormatJSON)
	require.True(t, created.Created)
	require.NotEmpty(t, created.Secret)

	requested, resolved := toolEvent(orgA, 7, TypeRequested, pendingCall), toolEvent(orgA, 8, TypeResolved, approvedCall)
	f.emit(t, requested)
	f.emit(t, resolved)

	got := rcv.await(t, 2)
	for i, ev := range []Event{requested, resolved} {
		d := got[i]
		require.True(t, verify(created.Secret, d), "the signature verifies with the secret: %s", d.header.Get(HeaderSignature))
		require.False(t, verify("another secret", d))
		require.Equal(t, "application/json", d.header.Get("Content-Type"))
		require.Equal(t, "approval."+ev.Type, d.header.Get(HeaderEvent))
		require.Equal(t, fmt.Sprintf("%s:%d", orgA, ev.Seq), d.header.Get(HeaderDelivery))
		var body map[string]any
		require.NoError(t, json.Unmarshal(d.body, &body))
		require.Equal(t, "approval."+ev.Type, body["type"])
		require.EqualValues(t, ev.Seq, body["seq"])
		require.Equal(t, KindToolCall, body["kind"])
		require.Equal(t, ev.ApprovalID.String(), body["approval_id"])
		require.Equal(t, ev.At.Format("2006-01-02T15:04:05Z07:00"), body["at"])
		approval, err := json.Marshal(body["approval"])
		require.NoError(t, err)
		require.JSONEq(t, string(ev.Approval), string(approval), "the approval as its GET route shows it")
	}
}

func TestASlackWebhookGetsOneHumanLineAndNoSignature(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.PublicURL = "https://reveille.example.com/" })
	rcv := newReceiver(t, 0)
	f.put(t, orgA, "team-channel", rcv.srv.URL+"/services/T0/B0/x", FormatSlack)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))

	d := rcv.await(t, 1)[0]
	require.Empty(t, d.header.Get(HeaderSignature))
	require.Equal(t, "application/json", d.header.Get("Content-Type"))
	var body map[string]string
	require.NoError(t, json.Unmarshal(d.body, &body))
	require.Equal(t, map[string]string{"text": "Agent `a1` asks to call `shell` in session `s1` (requested by `runtime`)." +
		" Approve or deny: <https://reveille.example.com/inbox|the approvals inbox>"}, body)
}

// The Slack line of each kind of event; approval text is agents' and is
// shown as escaped code that can neither mention nor link.
func TestSlackLinesSayWhoAsksForWhatAndWhoAnswered(t *testing.T) {
	overrun := func(extra string) string {
		return `{"agent_id":"a1","scope":"llm","cost":"100","budget":"10","spent":"5","reason":"a big prompt","requested_by":"runtime"` + extra + `}`
	}
	cases := []struct {
		name      string
		kind, typ string
		approval  string
		publicURL string
		want      string
	}{
		{"a tool call asked, without a public URL", KindToolCall, TypeRequested, pendingCall, "",
			"Agent `a1` asks to call `shell` in session `s1` (requested by `runtime`)."},
		{"a tool call approved by a human", KindToolCall, TypeResolved, approvedCall, "https://r.example",
			"The call of `shell` by agent `a1` in session `s1` was approved by `alice`."},
		{"a tool call denied by a policy", KindToolCall, TypeResolved,
			`{"agent_id":"a1","session_id":"s1","tool_name":"shell","status":"denied","source":"policy"}`, "",
			"The call of `shell` by agent `a1` in session `s1` was denied by a standing policy."},
		{"a tool call expired", KindToolCall, TypeResolved,
			`{"agent_id":"a1","session_id":"s1","tool_name":"shell","status":"expired","source":"expired"}`, "",
			"The call of `shell` by agent `a1` in session `s1` was not answered in time (expired)."},
		{"an overrun asked", KindMandateOverrun, TypeRequested, overrun(``), "https://r.example",
			"Agent `a1` asks to spend `100` on `llm` past its mandate (budget `10`, spent `5`), for `a big prompt` (requested by `runtime`)." +
				" Approve or deny: <https://r.example/inbox|the approvals inbox>"},
		{"an overrun without a mandate", KindMandateOverrun, TypeRequested,
			`{"agent_id":"a1","scope":"llm","cost":3,"refusal":"no_mandate","requested_by":"runtime"}`, "",
			"Agent `a1` asks to spend `3` on `llm` without a mandate (requested by `runtime`)."},
		{"an overrun under a revoked mandate", KindMandateOverrun, TypeRequested,
			`{"agent_id":"a1","scope":"llm","cost":3,"refusal":"revoked","budget":"10","spent":"0","requested_by":"runtime"}`, "",
			"Agent `a1` asks to spend `3` on `llm` under a mandate that is revoked (requested by `runtime`)."},
		{"an overrun denied with a note", KindMandateOverrun, TypeResolved,
			overrun(`,"state":"denied","resolved_by":"bob","note":"too much"`), "",
			"The spend of `100` on `llm` by agent `a1` was denied by `bob` (note: `too much`)."},
		{"hostile text", KindToolCall, TypeRequested,
			"{\"agent_id\":\"<!channel> `x`\",\"session_id\":\"<http://evil.example|click>\",\"tool_name\":\"a\\nb & c\",\"requested_by\":\"r\"}", "",
			"Agent `&lt;!channel&gt; 'x'` asks to call `a b &amp; c` in session `&lt;http://evil.example|click&gt;` (requested by `r`)."},
		{"an approval that says nothing", KindToolCall, TypeRequested, `null`, "",
			"Agent (none) asks to call (none) in session (none) (requested by (none))."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := toolEvent(orgA, 1, tc.typ, tc.approval)
			ev.Kind = tc.kind
			require.Equal(t, tc.want, slackText(ev, tc.publicURL))
		})
	}
}

func TestALongValueIsCutInASlackLine(t *testing.T) {
	long := strings.Repeat("é", maxShown+10)
	require.Equal(t, "`"+strings.Repeat("é", maxShown)+"…`", slackCode(long))
}

func TestAFailingReceiverIsRetriedUntilItTakesTheDelivery(t *testing.T) {
	f := newFixture(t)
	rcv := newReceiver(t, 3)
	secret := f.put(t, orgA, "flaky", rcv.srv.URL, FormatJSON).Secret
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))

	d := rcv.await(t, 1)[0]
	require.True(t, verify(secret, d), "every attempt carries the same signed body")
	require.Equal(t, 4, rcv.callCount(), "three 500s, then the delivery")
}

func TestAnotherOrgsWebhooksAreAbsentAndNeverGetItsEvents(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rcv := newReceiver(t, 0)
	f.put(t, orgA, "ops", rcv.srv.URL, FormatJSON)

	_, err := f.store.Get(ctx, orgB, "ops")
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, f.store.Delete(ctx, orgB, "ops"), ErrNotFound)
	list, err := f.store.List(ctx, orgB)
	require.NoError(t, err)
	require.Empty(t, list)

	f.emit(t, toolEvent(orgB, 1, TypeRequested, pendingCall))
	require.Zero(t, f.workCount(t, orgB), "org B's event enqueues nothing: it has no webhooks")
	require.Zero(t, f.workCount(t, orgA))

	// Org B's own webhook of the same name is its own.
	theirs := f.put(t, orgB, "ops", rcv.srv.URL+"/b", FormatSlack)
	require.True(t, theirs.Created)
	mine, err := f.store.Get(ctx, orgA, "ops")
	require.NoError(t, err)
	require.Equal(t, FormatJSON, mine.Format)
	require.Equal(t, rcv.srv.URL, mine.URL)

	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	d := rcv.await(t, 1)[0]
	require.Equal(t, orgA+":1", d.header.Get(HeaderDelivery))
	require.Equal(t, 1, f.workCount(t, orgA), "one delivery: org A's one webhook")
}

func TestReplacingAWebhookKeepsItsSecret(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first, second := newReceiver(t, 0), newReceiver(t, 0)
	created := f.put(t, orgA, "ops", first.srv.URL, FormatSlack)

	replaced := f.put(t, orgA, "ops", second.srv.URL+"/v2", FormatJSON)
	require.False(t, replaced.Created)
	require.Empty(t, replaced.Secret, "the secret is shown once")
	require.Equal(t, Webhook{Name: "ops", URL: second.srv.URL + "/v2", Format: FormatJSON,
		CreatedAt: created.Webhook.CreatedAt, UpdatedAt: replaced.Webhook.UpdatedAt}, replaced.Webhook)
	got, err := f.store.Get(ctx, orgA, "ops")
	require.NoError(t, err)
	require.Equal(t, replaced.Webhook, got)

	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	require.True(t, verify(created.Secret, second.await(t, 1)[0]), "signed with the secret shown at creation")
}

func TestBadInputIsRefusedNamingTheFieldAndStoresNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	good := "http://127.0.0.1:9/hook"
	cases := []struct {
		name, hook, url, format string
		field, detail           string
	}{
		{"an upper-case name", "Ops", good, FormatJSON, "name", "a-z"},
		{"an empty name", "", good, FormatJSON, "name", "a-z"},
		{"a name with a slash", "a/b", good, FormatJSON, "name", "a-z"},
		{"a name starting with a dash", "-ops", good, FormatJSON, "name", "a-z"},
		{"a name of 65 characters", strings.Repeat("a", 65), good, FormatJSON, "name", "1-64"},
		{"no url", "ops", "", FormatJSON, "url", "required"},
		{"a relative url", "ops", "/hook", FormatJSON, "url", "absolute http"},
		{"an ftp url", "ops", "ftp://127.0.0.1/hook", FormatJSON, "url", "absolute http"},
		{"a url without a host", "ops", "http:///hook", FormatJSON, "url", "absolute http"},
		{"a url with a space", "ops", "http://127.0.0.1/a b", FormatJSON, "url", "spaces"},
		{"a url too long", "ops", good + strings.Repeat("a", MaxURLBytes), FormatJSON, "url", "at most"},
		{"a private address no rule allows", "ops", "http://10.0.0.5/hook", FormatJSON, "url", "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"the cloud metadata endpoint", "ops", "http://169.254.169.254/latest", FormatJSON, "url", "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"a host outside the allow-list", "ops", "https://hooks.example/x", FormatJSON, "url", "REVEILLE_HTTP_ALLOWED_HOSTS"},
		{"no format", "ops", good, "", "format", "json"},
		{"an unknown format", "ops", good, "xml", "format", "json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.store.Put(ctx, orgA, tc.hook, PutParams{URL: tc.url, Format: tc.format})
			var inv *apperr.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Len(t, inv.Fields, 1, "%v", err)
			require.Equal(t, tc.field, inv.Fields[0].Field)
			require.Contains(t, inv.Fields[0].Detail, tc.detail)
		})
	}
	list, err := f.store.List(ctx, orgA)
	require.NoError(t, err)
	require.Empty(t, list)
}

func TestAnOrgHasAtMostMaxPerOrgWebhooks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for i := range MaxPerOrg {
		f.put(t, orgA, fmt.Sprint("hook-", i), "http://127.0.0.1:9/hook", FormatJSON)
	}
	_, err := f.store.Put(ctx, orgA, "one-more", PutParams{URL: "http://127.0.0.1:9/hook", Format: FormatJSON})
	require.ErrorIs(t, err, ErrTooMany)
	require.ErrorIs(t, err, apperr.ErrConflict)
	require.False(t, f.put(t, orgA, "hook-0", "http://127.0.0.1:9/other", FormatSlack).Created, "replacing one still works")
	f.put(t, orgB, "one-more", "http://127.0.0.1:9/hook", FormatJSON) // another org's count is its own
	list, err := f.store.List(ctx, orgA)
	require.NoError(t, err)
	require.Len(t, list, MaxPerOrg)
}

func TestDeliveriesCommitWithTheEventOrNotAtAll(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.put(t, orgA, "one", "http://127.0.0.1:9/hook", FormatJSON)
	f.put(t, orgA, "two", "http://127.0.0.1:9/hook", FormatSlack)
	// (Their URL answers nothing; the work rows are what is counted.)
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, f.store.Enqueue(ctx, tx, toolEvent(orgA, 1, TypeRequested, pendingCall)))
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, f.workCount(t, orgA), "a rolled-back event has no deliveries")

	require.NoError(t, pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		return f.store.Enqueue(ctx, tx, toolEvent(orgA, 1, TypeRequested, pendingCall))
	}))
	require.Equal(t, 2, f.workCount(t, orgA), "one delivery per webhook")
	// Outside a transaction the store opens its own.
	require.NoError(t, f.store.Enqueue(ctx, f.db, toolEvent(orgA, 2, TypeResolved, approvedCall)))
	require.Equal(t, 4, f.workCount(t, orgA))

	// On a connection inside a transaction its owner began with a BEGIN of
	// its own (the spend batch's and the wake-up gate's pipelines), the
	// deliveries join that transaction: a BEGIN and COMMIT of the store's
	// would have committed the owner's work half done.
	for _, onConn := range []struct {
		name string
		q    func(*pgxpool.Conn) db.Querier
	}{
		{"a pool's connection", func(c *pgxpool.Conn) db.Querier { return c }},
		{"its pgx connection", func(c *pgxpool.Conn) db.Querier { return c.Conn() }},
		{"joined as a transaction", func(c *pgxpool.Conn) db.Querier { return db.JoinedTx(c.Conn()) }},
	} {
		conn, err := f.db.Acquire(ctx)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		err = f.store.Enqueue(ctx, onConn.q(conn), toolEvent(orgA, 3, TypeResolved, approvedCall))
		status := conn.Conn().PgConn().TxStatus()
		_, rerr := conn.Exec(ctx, "ROLLBACK")
		conn.Release()
		require.NoError(t, err, onConn.name)
		require.NoError(t, rerr, onConn.name)
		require.Equal(t, "T", string(status), "%s: the owner's transaction is still open", onConn.name)
		require.Equal(t, 4, f.workCount(t, orgA), "%s: rolled back with the owner's transaction", onConn.name)
	}
}

// A notification never undoes the approval it announces: an org at its
// pending-work cap still gets its deliveries enqueued (and the event's
// transaction commits).
func TestAnOrgAtItsPendingCapStillGetsItsDeliveries(t *testing.T) {
	f := newFixtureWithPool(t, workpool.Config{MaxPendingPerOrg: 1})
	f.put(t, orgA, "one", "http://127.0.0.1:9/hook", FormatJSON)
	f.put(t, orgA, "two", "http://127.0.0.1:9/hook", FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	require.Equal(t, 2, f.workCount(t, orgA))
}

func TestADeliveryOfAHugeApprovalCarriesItsIDAlone(t *testing.T) {
	ev := toolEvent(orgA, 1, TypeRequested, `{"input":"`+strings.Repeat("x", MaxBodyBytes)+`"}`)
	body, err := jsonBody(ev)
	require.NoError(t, err)
	require.LessOrEqual(t, len(body), MaxBodyBytes)
	var got map[string]any
	require.NoError(t, json.Unmarshal(body, &got))
	require.Equal(t, true, got["approval_truncated"])
	require.Equal(t, map[string]any{"id": ev.ApprovalID.String()}, got["approval"])
}

func TestAnEventOfAnUnknownTypeIsAnError(t *testing.T) {
	f := newFixture(t)
	err := f.store.Enqueue(context.Background(), f.db, toolEvent(orgA, 1, "maybe", pendingCall))
	require.ErrorContains(t, err, `"maybe"`)
}

// A webhook whose host the allow-list dropped after it was registered
// fails its deliveries when they run, not the approval whose transaction
// enqueues them: the enqueue skips the http handler's check at enqueue.
func TestAWebhookTheAllowListDroppedSinceDoesNotFailTheApproval(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CheckURL = nil }) // (registered while the host was allowed)
	f.put(t, orgA, "gone", "https://hooks.example.com/hook", FormatJSON)
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	require.Equal(t, 1, f.workCount(t, orgA), "the delivery is enqueued, and fails for good when it runs")
}

func TestAWebhookShowsItsLastDeliveryAndItsLastFailure(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Retry = &workpool.RetryPolicy{MaxAttempts: 2, InitialBackoffMS: 10, Base: 1} })
	ctx := context.Background()
	rcv := newReceiver(t, 2) // (both attempts of the first delivery fail)
	f.put(t, orgA, "ops", rcv.srv.URL, FormatJSON)
	f.put(t, orgA, "quiet", newReceiver(t, 0).srv.URL, FormatJSON) // (its own receiver: the failures are ops's)
	w, err := f.store.Get(ctx, orgA, "ops")
	require.NoError(t, err)
	require.Nil(t, w.LastDelivery, "none has finished")
	require.Nil(t, w.LastFailure)

	awaitDelivery := func(seq int64) Webhook {
		t.Helper()
		var w Webhook
		require.Eventually(t, func() bool {
			w, err = f.store.Get(ctx, orgA, "ops")
			require.NoError(t, err)
			return w.LastDelivery != nil && w.LastDelivery.Seq == seq
		}, testWait, 10*time.Millisecond)
		return w
	}
	f.emit(t, toolEvent(orgA, 1, TypeRequested, pendingCall))
	w = awaitDelivery(1)
	require.Equal(t, "failed", w.LastDelivery.Outcome)
	require.Contains(t, w.LastDelivery.Error, "HTTP 500")
	require.Equal(t, rcv.srv.URL, w.LastDelivery.URL)
	require.Equal(t, w.LastDelivery, w.LastFailure)
	var state, lastErr string
	require.NoError(t, f.db.QueryRow(ctx, `SELECT state, COALESCE(error, '') FROM workpool_work WHERE org_id = $1 AND id = $2`,
		orgA, w.LastFailure.WorkID).Scan(&state, &lastErr))
	require.Equal(t, "finished", state, "the work_id names the delivery's work item")
	require.Contains(t, lastErr, "HTTP 500")

	f.emit(t, toolEvent(orgA, 2, TypeResolved, approvedCall))
	w = awaitDelivery(2)
	require.Equal(t, "succeeded", w.LastDelivery.Outcome)
	require.Empty(t, w.LastDelivery.Error)
	require.EqualValues(t, 1, w.LastFailure.Seq, "the failure is kept after a success")

	list, err := f.store.List(ctx, orgA)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, []string{"ops", "quiet"}, []string{list[0].Name, list[1].Name})
	require.Equal(t, w, list[0], "the list shows the same")

	_, err = f.store.Get(ctx, orgB, "ops")
	require.ErrorIs(t, err, ErrNotFound, "another org's webhook stays absent")
}

func TestADeliveryOfADeletedWebhookFinishesWithoutARowToRecordOn(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rcv := newReceiver(t, 0)
	f.put(t, orgA, "ops", rcv.srv.URL, FormatJSON)
	require.NoError(t, pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error {
		if err := f.store.Enqueue(ctx, tx, toolEvent(orgA, 1, TypeRequested, pendingCall)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM approval_webhooks WHERE org_id = $1`, orgA)
		return err
	}))
	rcv.await(t, 1)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.db.QueryRow(ctx, `SELECT count(*) FROM workpool_work WHERE org_id = $1 AND state = 'finished' AND outcome = 'succeeded'`, orgA).Scan(&n))
		return n == 1
	}, testWait, 10*time.Millisecond, "the hook finds no webhook and the delivery completes all the same")
}

// An event's transaction holds the org's webhooks as it read them until it
// commits: a DELETE, or a PUT that replaces the URL, waits for it, so once
// the admin has the answer no event committed later goes to the webhook
// deleted or to the old URL. (They answered at once, and an event that
// committed after a 204 was delivered to the deleted webhook — the whole
// approval, to an endpoint the admin had just cut off.)
func TestAWebhooksDeleteOrReplaceWaitsForTheEventsThatReadIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f fixture, url string) error
	}{
		{"delete", func(f fixture, _ string) error { return f.store.Delete(context.Background(), orgA, "ops") }},
		{"replace", func(f fixture, url string) error {
			_, err := f.store.Put(context.Background(), orgA, "ops", PutParams{URL: url, Format: FormatJSON})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			old, repl := newReceiver(t, 0), newReceiver(t, 0)
			f.put(t, orgA, "ops", old.srv.URL+"/hook", FormatJSON)

			tx, err := f.db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			require.NoError(t, f.store.Enqueue(ctx, tx, toolEvent(orgA, 1, TypeRequested, pendingCall)))
			changed := make(chan error, 1)
			go func() { changed <- tc.change(f, repl.srv.URL+"/hook") }()
			require.Eventually(t, func() bool {
				var waiting bool
				err := f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%approval_webhooks%')`).Scan(&waiting)
				return assert.NoError(t, err) && waiting
			}, 10*time.Second, 5*time.Millisecond, "the %s waits for the event that read the webhook", tc.name)
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-changed)
			require.Equal(t, 1, f.workCount(t, orgA), "the event committed first, for the webhook it read")
		})
	}
}

// A delivery's completion locks the org's queue row (sqlComplete's
// requeued CTE: a delivery to retry) and then its hook updates the webhook
// (qDelivered); an event of the org reads its webhooks and then enqueues
// into that queue. The event's read must not lock the webhook against the
// hook's update, or the two wait for each other: read FOR SHARE, the
// event's transaction was ended by "deadlock detected" (the approval it
// carried failed with it).
func TestAnEventAndADeliverysCompletionDoNotDeadlock(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rcv := newReceiver(t, 0)
	put := f.put(t, orgA, "ops", rcv.srv.URL+"/hook", FormatJSON)

	// the completer's transaction: a retried delivery of org A requeued
	// (sqlComplete's requeued CTE) ...
	c, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = c.Rollback(ctx) }()
	_, err = c.Exec(ctx, `INSERT INTO workpool_org_queues (pool, org_id, head_at) VALUES ($1, $2, now())
		ON CONFLICT (pool, org_id) DO UPDATE SET head_at = least(workpool_org_queues.head_at, excluded.head_at)`,
		f.store.cfg.Pool, orgA)
	require.NoError(t, err)

	// ... while an event of org A commits its deliveries
	evDone := make(chan error, 1)
	go func() {
		tx, err := f.db.Begin(ctx)
		if err != nil {
			evDone <- err
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := f.store.Enqueue(ctx, tx, toolEvent(orgA, 1, TypeRequested, pendingCall)); err != nil {
			evDone <- err
			return
		}
		evDone <- tx.Commit(ctx)
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%workpool_org_queues%')`).Scan(&waiting)
		return assert.NoError(t, err) && waiting
	}, 10*time.Second, 5*time.Millisecond, "the event's enqueue waits for the org queue row")

	// the same completion batch then runs the delivered hook of a delivery
	// to "ops" that finished
	hookCtx, err := json.Marshal(deliveryContext{Name: "ops", Created: &put.Webhook.CreatedAt, Seq: 0, URL: rcv.srv.URL + "/hook"})
	require.NoError(t, err)
	hookErr := f.store.delivered(ctx, c, workpool.Completion{WorkID: uuid.Must(uuid.NewV7()), OrgID: orgA,
		Pool: f.store.cfg.Pool, Outcome: workpool.OutcomeSucceeded, Context: hookCtx})
	if hookErr == nil {
		require.NoError(t, c.Commit(ctx))
	} else {
		_ = c.Rollback(ctx)
	}
	evErr := <-evDone
	require.NoError(t, hookErr, "the completion's hook")
	require.NoError(t, evErr, "the event's transaction")
}
