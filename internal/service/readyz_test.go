package service_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/service"
)

// A Temporal that accepts connections and never answers (a hung frontend,
// a stopped process behind a live socket) leaves the replica ready (SPEC
// §2) — which a prober sees only if /readyz answers within its timeout
// (Kubernetes' default: 1 s). Its answer must not wait for Temporal.
func TestReadyzAnswersPromptlyWhileTemporalHangs(t *testing.T) {
	ctx := context.Background()
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer hung.Close()
	go func() { // accept and say nothing
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	cfg := testConfig(t)
	cfg.TemporalAddress = hung.Addr().String()
	svc, err := service.New(ctx, cfg)
	require.NoError(t, err)
	addr := run(t, svc)

	// Under the 3 s a dependency's check may take elsewhere (the scrape's
	// reveille_dependency_up), with room for a busy machine above the
	// 500 ms Temporal gets here.
	client := &http.Client{Timeout: 2500 * time.Millisecond}
	start := time.Now()
	res, err := client.Get("http://" + addr + "/readyz")
	require.NoError(t, err, "/readyz answered after %s", time.Since(start))
	defer res.Body.Close()
	var body struct{ Checks map[string]string }
	require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
	require.Equal(t, http.StatusOK, res.StatusCode, "ready: Postgres answers")
	require.True(t, strings.HasPrefix(body.Checks["temporal"], "down"), "temporal: %q", body.Checks["temporal"])
}
