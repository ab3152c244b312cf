package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/queue"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// withWakeups adds the wake-up service with its own pool manager (handler
// "echo", and whatever register adds; loops not started) and the mandates
// service if missing.
func withWakeups(t *testing.T, register ...func(*workpool.Manager)) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		pool, err := workpool.New(sv.DB, workpool.Config{Logger: testkit.Logger(t)})
		require.NoError(t, err)
		pool.Register("echo", func(_ context.Context, j workpool.Job) (json.RawMessage, error) { return j.Args, nil })
		for _, r := range register {
			r(pool)
		}
		if sv.Mandates == nil {
			sv.Mandates = mandates.New(sv.DB, mandates.Config{Logger: testkit.Logger(t)})
		}
		sv.Wakeups = wakeup.New(sv.DB, pool, sv.Mandates, wakeup.Config{Logger: testkit.Logger(t)})
	}
}

// The round trip through Temporal is tested in internal/e2e; here, the
// HTTP contract at the gate.
func TestWakeupRefusalIsA402NamingBothIDs(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	body := map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "reason": "r", "cost": 5,
		"work": map[string]any{"handler": "echo", "args": map[string]any{"k": "v"}},
	}
	p := do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body).requireProblem(t, http.StatusPaymentRequired)
	wakeupID, approvalID := p["wakeup_id"].(string), p["approval_id"].(string)
	require.NotEmpty(t, approvalID)

	r := do(t, s.Handler(), http.MethodGet, "/v1/wakeups/"+wakeupID, token(t, "org-a", "agent"), nil)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	w := r.JSON(t)
	require.Equal(t, "pending", w["status"])
	require.Nil(t, w["outcome"])
	require.Equal(t, map[string]any{"id": approvalID, "state": "pending"}, w["approval"])
	require.Equal(t, map[string]any{"state": "waiting", "attempts": float64(0)}, w["delivery"])

	body["work"].(map[string]any)["handler"] = "nope"
	do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body).requireProblem(t, http.StatusBadRequest, "work.handler")
}

// A retry of a wake-up request that the server answers from the wake-up
// (another caller's retry under the same key, or one after the first
// answer is no longer kept) gets the first answer's kind: a refused
// request's 402, naming how its approval was settled since (never a 201
// for a wake-up that was not funded), and a funded request's 201, as it was
// (SPEC §5: pending, no outcome) even once the wake-up has resolved.
func TestARetriedWakeupRequestIsAnsweredAsItsFundingStands(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	h := s.Handler()
	first, second := subToken(t, "org-a", "rt-1", "", RoleAgent), subToken(t, "org-a", "rt-2", "", RoleAgent)
	body := map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "cost": 5,
		"work": map[string]any{"handler": "echo"},
	}
	refused := do(t, h, http.MethodPost, "/v1/wakeups", first, body, "Idempotency-Key", "k-refused").requireProblem(t, http.StatusPaymentRequired)
	approval := refused["approval_id"].(string)
	r := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+approval+"/deny", subToken(t, "org-a", "alice", "", RoleApprover), map[string]any{})
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))

	again := do(t, h, http.MethodPost, "/v1/wakeups", second, body, "Idempotency-Key", "k-refused").requireProblem(t, http.StatusPaymentRequired)
	require.Equal(t, "approval denied", again["refusal"])
	require.Equal(t, approval, again["approval_id"])
	require.Equal(t, refused["wakeup_id"], again["wakeup_id"])
	require.Contains(t, again["detail"], "was denied: the wake-up resolved as denied")

	canceled := do(t, h, http.MethodPost, "/v1/wakeups", first, body, "Idempotency-Key", "k-canceled").requireProblem(t, http.StatusPaymentRequired)
	r = do(t, h, http.MethodPost, "/v1/wakeups/"+canceled["wakeup_id"].(string)+"/cancel", first, nil)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	again = do(t, h, http.MethodPost, "/v1/wakeups", second, body, "Idempotency-Key", "k-canceled").requireProblem(t, http.StatusPaymentRequired)
	require.Equal(t, "approval canceled", again["refusal"])
	require.Contains(t, again["detail"], "was canceled: the wake-up resolved as canceled")

	var count int
	require.NoError(t, s.svc.DB.QueryRow(context.Background(), `SELECT count(*) FROM wakeups`).Scan(&count))
	require.Equal(t, 2, count, "nothing new written")

	// (funded: the outcome written as the work's hook would write it)
	r = do(t, h, http.MethodPost, "/v1/mandates", token(t, "org-a", RoleAdmin), map[string]any{"agent_id": "a1", "scope": "ok", "budget": 100})
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	created := do(t, h, http.MethodPost, "/v1/wakeups", first, map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-2", "signal": "wake", "scope": "ok", "cost": 1,
		"work": map[string]any{"handler": "echo"}}, "Idempotency-Key", "k-funded")
	require.Equal(t, http.StatusCreated, created.Status, string(created.Body))
	id := created.JSON(t)["id"].(string)
	require.Equal(t, map[string]any{"id": id, "status": "pending", "outcome": nil}, created.JSON(t))
	_, err := s.svc.DB.Exec(context.Background(), `UPDATE wakeups SET state = 'resolved', outcome = 'succeeded' WHERE id = $1`, id)
	require.NoError(t, err)
	replayed := do(t, h, http.MethodPost, "/v1/wakeups", second, map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-2", "signal": "wake", "scope": "ok", "cost": 1,
		"work": map[string]any{"handler": "echo"}}, "Idempotency-Key", "k-funded")
	require.Equal(t, http.StatusCreated, replayed.Status, string(replayed.Body))
	require.Equal(t, map[string]any{"id": id, "status": "pending", "outcome": nil}, replayed.JSON(t))
}

// Work the http handler would refuse for good whatever happened later —
// arguments that are not its object, no http(s) URL, a bad method, a host
// outside the allow-list — is a 400 naming the field inside work.args, and
// nothing is spent or written.
func TestAWakeupWhoseHTTPWorkCouldNeverRunIsA400AndSpendsNothing(t *testing.T) {
	s := newTestServer(t, withWakeups(t, func(m *workpool.Manager) {
		require.NoError(t, httpwork.Register(m, httpwork.Config{AllowedHosts: []string{"api.example.com"}}))
	}))
	ctx := context.Background()
	_, err := s.svc.Mandates.Create(ctx, "org-a", mandates.CreateParams{AgentID: "a1", Scope: "llm", Budget: 1000})
	require.NoError(t, err)
	post := func(args any) response {
		body := map[string]any{
			"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "cost": 5,
			"work": map[string]any{"handler": "http", "args": args},
		}
		return do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body)
	}
	for _, tc := range []struct {
		name  string
		args  any
		field string
	}{
		{"arguments that are not an object", "https://api.example.com/x", "work.args"},
		{"no url", map[string]any{}, "work.args.url"},
		{"not an http(s) url", map[string]any{"url": "ftp://api.example.com/x"}, "work.args.url"},
		{"a bad method", map[string]any{"url": "https://api.example.com/x", "method": "GE T"}, "work.args.method"},
		{"a host outside the allow-list", map[string]any{"url": "https://elsewhere.example.com/x"}, "work.args.url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			post(tc.args).requireProblem(t, http.StatusBadRequest, tc.field)
		})
	}
	var spent, wakeups int
	require.NoError(t, s.svc.DB.QueryRow(ctx, `SELECT spent, (SELECT count(*) FROM wakeups) FROM mandates WHERE org_id = 'org-a'`).Scan(&spent, &wakeups))
	require.Zero(t, spent, "nothing spent")
	require.Zero(t, wakeups, "no wake-up written")
	require.Equal(t, http.StatusCreated, post(map[string]any{"url": "https://api.example.com/x", "method": "post"}).Status)
}

// A wake-up request missing its cost or its work names, in the same
// answer, every other required field it lacks: an integrator fixes them in
// one round trip, not one per field.
func TestAWakeupMissingFieldsNamesEveryOneOfThem(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	tok := token(t, "org-a", "agent")
	do(t, s.Handler(), http.MethodPost, "/v1/wakeups", tok, map[string]any{}).
		requireProblem(t, http.StatusBadRequest, "cost", "work", "agent_id", "workflow_id", "signal", "scope")
	do(t, s.Handler(), http.MethodPost, "/v1/wakeups", tok, map[string]any{"work": map[string]any{"key_limit": 0}}).
		requireProblem(t, http.StatusBadRequest, "cost", "work.key_limit", "work.handler", "agent_id")
}

// withCountedDB puts the server on a database whose round trips rt counts.
func withCountedDB(t *testing.T, rt *testkit.RoundTrips) func(*Config, *Services) {
	return func(_ *Config, sv *Services) {
		cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
		require.NoError(t, err)
		cfg.ConnConfig.Tracer = rt
		db, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(db.Close)
		sv.DB = db
	}
}

// The wake-up request is the product's main call: on the common path (the
// mandate covers it) it costs at most four round trips to Postgres, and
// the Idempotency-Key layer adds its claim and its record.
func TestAWakeupRequestTakesAtMostFourRoundTripsOnTheAllowedPath(t *testing.T) {
	tests := []struct {
		name      string
		key       bool
		status    int
		maxTrips  int
		overspend bool
		inbox     bool
	}{
		{name: "allowed, no Idempotency-Key", status: http.StatusCreated, maxTrips: 4},
		{name: "allowed, with an Idempotency-Key", key: true, status: http.StatusCreated, maxTrips: 6},
		{name: "refused by the mandate", overspend: true, status: http.StatusPaymentRequired, maxTrips: 3},
		// (the refusal's inbox event: its request read, then the append)
		{name: "refused by the mandate, with the approvals inbox", overspend: true, inbox: true, status: http.StatusPaymentRequired, maxTrips: 5},
		{name: "allowed, with the approvals inbox", inbox: true, status: http.StatusCreated, maxTrips: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &testkit.RoundTrips{}
			opts := []func(*Config, *Services){withCountedDB(t, rt)}
			if tt.inbox {
				opts = append(opts, withInbox(t, 0))
			}
			s := newTestServer(t, append(opts, withWakeups(t))...)
			ctx := context.Background()
			_, err := s.svc.Mandates.Create(ctx, "org-a", mandates.CreateParams{AgentID: "a1", Scope: "llm", Budget: 1000})
			require.NoError(t, err)
			tok := token(t, "org-a", "agent")
			post := func(i int) response {
				cost := 1
				if tt.overspend {
					cost = 5000
				}
				body := map[string]any{
					"agent_id": "a1", "workflow_id": fmt.Sprintf("org-a/wf-%d", i), "signal": "wake", "scope": "llm", "cost": cost,
					"work": map[string]any{"handler": "echo", "args": map[string]any{"i": i}},
				}
				var headers []string
				if tt.key {
					headers = []string{"Idempotency-Key", fmt.Sprintf("k-%d", i)}
				}
				return do(t, s.Handler(), http.MethodPost, "/v1/wakeups", tok, body, headers...)
			}
			// Warm up: connections opened, statements prepared, caches filled.
			for i := range 3 {
				require.Equal(t, tt.status, post(i).Status)
			}
			// A request is answered before its connection is back in the
			// pool: wait for the warm-up's last trips, so none is counted
			// as the measured request's.
			require.Eventually(t, func() bool { return s.svc.DB.Stat().AcquiredConns() == 0 }, testWait, pollEvery)
			rt.Take()

			r := post(100)

			require.Equal(t, tt.status, r.Status, string(r.Body))
			trips := rt.Take()
			require.LessOrEqual(t, len(trips), tt.maxTrips, "round trips:\n%s", strings.Join(trips, "\n"))
			t.Logf("%d round trips:\n%s", len(trips), strings.Join(trips, "\n"))
		})
	}
}

// An admin lists the wake-ups by their signal's delivery state — waiting
// (not resolved yet), queued, sent, undeliverable — and sees only its own
// org's: another org's undeliverable wake-up is as absent as none. A
// state outside the four is a 400 naming delivery.
func TestWakeupsListByDeliveryStateShowsOnlyTheOrgsWakeupsInThatState(t *testing.T) {
	var db *pgxpool.Pool
	s := newTestServer(t, withWakeups(t), func(_ *Config, sv *Services) { db = sv.DB })
	h, ctx := s.Handler(), context.Background()
	_, err := s.svc.Mandates.Create(ctx, "org-a", mandates.CreateParams{AgentID: "a1", Scope: "paid", Budget: 10})
	require.NoError(t, err)
	// A refused wake-up (no mandate for its scope) canceled at once is
	// resolved, its signal queued; settle moves that signal on.
	newWakeup := func(org, scope, settle string) string {
		t.Helper()
		body := map[string]any{"agent_id": "a1", "workflow_id": org + "/wf", "signal": "wake", "scope": scope, "cost": 1,
			"work": map[string]any{"handler": "echo"}}
		r := do(t, h, http.MethodPost, "/v1/wakeups", token(t, org, "agent"), body)
		if scope == "paid" {
			require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
			return r.JSON(t)["id"].(string)
		}
		id := r.requireProblem(t, http.StatusPaymentRequired)["wakeup_id"].(string)
		require.Equal(t, http.StatusOK, do(t, h, http.MethodPost, "/v1/wakeups/"+id+"/cancel", token(t, org, "agent"), nil).Status)
		if settle != "" {
			msg, err := queue.GetByKey(ctx, db, org, wakeup.Queue, id)
			require.NoError(t, err)
			require.NoError(t, queue.Settle(ctx, db, org, msg.ID, settle, "test"))
		}
		return id
	}
	waiting := newWakeup("org-a", "paid", "")
	queued := newWakeup("org-a", "free", "")
	sent := newWakeup("org-a", "free", queue.StatusDelivered)
	undeliverable := newWakeup("org-a", "free", queue.StatusFailed)
	otherOrgs := newWakeup("org-b", "free", queue.StatusFailed)

	for _, tc := range []struct {
		org, delivery string
		want          []string
	}{
		{"org-a", "waiting", []string{waiting}},
		{"org-a", "queued", []string{queued}},
		{"org-a", "sent", []string{sent}},
		{"org-a", "undeliverable", []string{undeliverable}},
		{"org-b", "undeliverable", []string{otherOrgs}},
		{"org-b", "sent", nil},
		{"org-c", "undeliverable", nil},
	} {
		t.Run(tc.org+"/"+tc.delivery, func(t *testing.T) {
			r := do(t, h, http.MethodGet, "/v1/wakeups?delivery="+tc.delivery, token(t, tc.org, "admin"), nil)
			require.Equal(t, http.StatusOK, r.Status, string(r.Body))
			var got []string
			for _, it := range r.JSON(t)["items"].([]any) {
				w := it.(map[string]any)
				got = append(got, w["id"].(string))
				require.Equal(t, tc.delivery, w["delivery"].(map[string]any)["state"])
			}
			require.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"lost", "failed", "SENT"} {
		t.Run("invalid "+bad, func(t *testing.T) {
			do(t, h, http.MethodGet, "/v1/wakeups?delivery="+bad, token(t, "org-a", "admin"), nil).requireProblem(t, http.StatusBadRequest, "delivery")
		})
	}
}

// A wake-up of cost 0 is not refused past an approved overrun of its
// mandate (spent above budget): the gate's spend is the mandates' own,
// where what is left is never below 0.
func TestAZeroCostWakeupIsNotRefusedAfterAnApprovedOverrun(t *testing.T) {
	s := newTestServer(t, withMandates(t), withWakeups(t))
	h := s.Handler()
	createMandate(t, h, token(t, "org-a", "admin"), "a1", "llm", 5)
	agent := subToken(t, "org-a", "alice", "", RoleAgent)
	bob := subToken(t, "org-a", "bob", "", RoleApprover)
	p := do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"a1","scope":"llm","cost":8}`).requireProblem(t, http.StatusPaymentRequired)
	r := do(t, h, http.MethodPost, "/v1/mandate-approvals/"+p["approval_id"].(string)+"/approve", bob, `{}`)
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))

	r = do(t, h, http.MethodPost, "/v1/mandates/spend", agent, `{"agent_id":"a1","scope":"llm","cost":0}`)
	require.Equal(t, http.StatusOK, r.Status, "a spend of 0: %s", r.Body)
	r = do(t, h, http.MethodPost, "/v1/wakeups", agent, map[string]any{"agent_id": "a1", "workflow_id": "org-a/wf", "signal": "wake",
		"scope": "llm", "cost": 0, "work": map[string]any{"handler": "echo"}})
	require.Equal(t, http.StatusCreated, r.Status, "a wake-up of cost 0: %s", r.Body)
}
