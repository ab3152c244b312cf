package main

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/devstack"
)

// README: "--addr … port a number up to 65535" (0 included: a free one),
// and engine dev "prints the API URL … a curl line that calls /v1/whoami"
// and the inbox link. With --addr 127.0.0.1:0 the banner must name the
// port the API listens on, not ":0".
func TestTheDevBannerNamesThePortTheAPIListensOn(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	t.Cleanup(func() { _ = devstack.RemoveDataDir(context.Background(), dir) })
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = saved }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runDev(ctx, []string{"--addr", "127.0.0.1:0", "--temporal-port", "0", "--data-dir", dir})
	}()
	defer func() { cancel(); <-done }()

	apiLine := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "API" {
				apiLine <- f[1]
			}
		}
	}()
	var url string
	select {
	case url = <-apiLine:
	case err := <-done:
		t.Fatalf("engine dev ended: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("no banner")
	}

	require.NotContains(t, url, ":0", "the banner's API URL")
	res, err := http.Get(url + "/healthz")
	require.NoError(t, err, "the banner's API URL %s answers", url)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
}
