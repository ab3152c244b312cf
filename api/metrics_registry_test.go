package api

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
)

// Two servers given one registry (two listeners of one binary, a test
// that builds a second server): New reports the clash as the error it
// already has for reveille_dependency_up, rather than panicking on the
// HTTP metrics registered just before it.
func TestASecondServerOnTheSameRegistryIsAnErrorNotAPanic(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Auth: AuthConfig{Secrets: [][]byte{testSecret}}, Registry: reg, Logger: testkit.Logger(t)}
	svc := Services{DB: testkit.NewPool(t)}
	_, err := New(context.Background(), cfg, svc)
	require.NoError(t, err)
	require.NotPanics(t, func() {
		_, err = New(context.Background(), cfg, svc)
	})
	require.Error(t, err)
}
