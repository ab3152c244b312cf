package webhooks

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	orgA = "org-a"
	orgB = "org-b"
)

// testWait bounds every wait for a delivery.
const testWait = 15 * time.Second

// allowLocal is the network rules of the tests: the receivers listen on
// 127.0.0.1, which only an address entry of the allow-list lets the http
// handler reach.
var allowLocal = httpwork.Config{AllowedHosts: []string{"127.0.0.1:*"}}

// fixture is a store on a fresh database whose deliveries run in a real
// pool through the real http handler.
type fixture struct {
	store *Store
	db    *pgxpool.Pool
	pool  *workpool.Manager
}

func newFixture(t *testing.T, mutate ...func(*Config)) fixture {
	t.Helper()
	return newFixtureWithPool(t, workpool.Config{}, mutate...)
}

// newFixtureWithPool is newFixture with the pool's config (its timings
// are the test's).
func newFixtureWithPool(t *testing.T, poolCfg workpool.Config, mutate ...func(*Config)) fixture {
	t.Helper()
	db := testkit.NewPool(t)
	poolCfg.Logger, poolCfg.Cooldown, poolCfg.LeaderRetry, poolCfg.StopGrace = testkit.Logger(t), 50*time.Millisecond, 50*time.Millisecond, time.Second
	pool, err := workpool.New(db, poolCfg)
	require.NoError(t, err)
	require.NoError(t, httpwork.Register(pool, allowLocal))
	require.NoError(t, pool.Start(context.Background()))
	t.Cleanup(func() { _ = pool.Stop(context.Background()) })
	rules, err := httpwork.NewURLRules(allowLocal)
	require.NoError(t, err)
	cfg := Config{CheckURL: rules.CheckURL, Retry: &workpool.RetryPolicy{MaxAttempts: 5, InitialBackoffMS: 10, Base: 1}}
	for _, m := range mutate {
		m(&cfg)
	}
	return fixture{store: New(db, pool, cfg), db: db, pool: pool}
}

func (f fixture) put(t *testing.T, org, name, url, format string) PutResult {
	t.Helper()
	res, err := f.store.Put(context.Background(), org, name, PutParams{URL: url, Format: format})
	require.NoError(t, err)
	return res
}

// emit enqueues ev's deliveries in a transaction of its own, as the event
// log's append does in the state change's.
func (f fixture) emit(t *testing.T, ev Event) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, f.db, func(tx pgx.Tx) error { return f.store.Enqueue(ctx, tx, ev) }))
}

func (f fixture) workCount(t *testing.T, org string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(context.Background(), `SELECT count(*) FROM workpool_work WHERE org_id = $1`, org).Scan(&n))
	return n
}

// toolEvent is an event about a tool call of agent a1 in session s1.
func toolEvent(org string, seq int64, typ string, approval string) Event {
	return Event{OrgID: org, Seq: seq, Type: typ, Kind: KindToolCall, ApprovalID: uuid.Must(uuid.NewV7()),
		Approval: json.RawMessage(approval), At: time.Date(2026, 12, 1, 12, 0, int(seq), 0, time.UTC)}
}

const (
	pendingCall  = `{"agent_id":"a1","session_id":"s1","tool_name":"shell","input":{"cmd":"ls <dir>"},"status":"pending","requested_by":"runtime"}`
	approvedCall = `{"agent_id":"a1","session_id":"s1","tool_name":"shell","input":{"cmd":"ls <dir>"},"status":"approved","source":"human","resolved_by":"alice","requested_by":"runtime"}`
)

// delivery is one request a receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// receiver is a real HTTP server that records what it is sent; fail
// answers 500 to the first n requests.
type receiver struct {
	srv *httptest.Server
	got chan delivery

	mu    sync.Mutex
	fail  int
	calls int
}

func newReceiver(t *testing.T, fail int) *receiver {
	t.Helper()
	r := &receiver{got: make(chan delivery, 100), fail: fail}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.calls++
		failing := r.calls <= r.fail
		r.mu.Unlock()
		if failing {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		r.got <- delivery{header: req.Header.Clone(), body: body}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// await returns the next n deliveries, ordered by X-Reveille-Delivery.
func (r *receiver) await(t *testing.T, n int) []delivery {
	t.Helper()
	var out []delivery
	timeout := time.After(testWait)
	for len(out) < n {
		select {
		case d := <-r.got:
			out = append(out, d)
		case <-timeout:
			t.Fatalf("got %d of %d deliveries", len(out), n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].header.Get(HeaderDelivery) < out[j].header.Get(HeaderDelivery) })
	return out
}
