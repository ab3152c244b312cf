package service_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/reveille/reveille/internal/service"
)

// fakeFrontend is a Temporal frontend that answers health checks and
// DescribeNamespace, over real gRPC: whether the namespace exists is what
// it says (the service sees Temporal's own NotFound error). A real server
// runs only in internal/e2e.
type fakeFrontend struct {
	workflowservice.UnimplementedWorkflowServiceServer
	namespace atomic.Pointer[string] // the one namespace it has
	addr      string
}

func startFakeFrontend(t *testing.T, namespace string) *fakeFrontend {
	t.Helper()
	f := &fakeFrontend{}
	f.namespace.Store(&namespace)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	workflowservice.RegisterWorkflowServiceServer(srv, f)
	hs := health.NewServer()
	hs.SetServingStatus("temporal.api.workflowservice.v1.WorkflowService", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	f.addr = ln.Addr().String()
	return f
}

func (f *fakeFrontend) DescribeNamespace(_ context.Context, req *workflowservice.DescribeNamespaceRequest) (*workflowservice.DescribeNamespaceResponse, error) {
	if req.GetNamespace() != *f.namespace.Load() {
		// As Temporal's server does: the error travels as a gRPC status.
		return nil, serviceerror.ToStatus(serviceerror.NewNamespaceNotFound(req.GetNamespace())).Err()
	}
	return &workflowservice.DescribeNamespaceResponse{}, nil
}

// A namespace Temporal says it does not have stops the start, named by
// TEMPORAL_NAMESPACE, before the database is touched: every signal to it
// would fail forever.
func TestNewFailsNamingTheNamespaceTemporalDoesNotHave(t *testing.T) {
	cfg := testConfig(t)
	cfg.TemporalAddress = startFakeFrontend(t, "default").addr
	cfg.Namespace = "nope"
	cfg.DatabaseURL = "postgres://never-dialled.invalid/reveille" // dialled, New would wait 30 s for it

	_, err := service.New(context.Background(), cfg)

	require.EqualError(t, err, `TEMPORAL_NAMESPACE="nope": Temporal at `+cfg.TemporalAddress+
		` has no such namespace (every signal would fail): register it or name an existing one`)
}

// /readyz and reveille_dependency_up say Temporal is down, naming the
// namespace, when Temporal answers but no longer has it; with it, ok.
func TestReadinessReportsANamespaceTemporalDoesNotHave(t *testing.T) {
	ctx := context.Background()
	frontend := startFakeFrontend(t, "reveille")
	cfg := testConfig(t)
	cfg.TemporalAddress = frontend.addr
	cfg.Namespace = "reveille"
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	addr := run(t, svc)

	readyz := func() (int, map[string]string) {
		res, err := http.Get("http://" + addr + "/readyz")
		require.NoError(t, err)
		defer res.Body.Close()
		var body struct{ Checks map[string]string }
		require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
		return res.StatusCode, body.Checks
	}
	code, checks := readyz()
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", checks["temporal"])

	other := "another"
	frontend.namespace.Store(&other) // the namespace was deleted
	code, checks = readyz()
	require.Equal(t, http.StatusOK, code, "Temporal's state does not take the replica out of rotation")
	require.Equal(t, `down: TEMPORAL_NAMESPACE="reveille": Temporal at `+frontend.addr+
		` has no such namespace (every signal would fail): register it or name an existing one`, checks["temporal"])
}
