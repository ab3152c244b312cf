package main

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// engine version printed "dev" for every build made without -ldflags; it
// now adds what the build recorded of itself, and still answers without.
func TestVersionNamesTheBuild(t *testing.T) {
	vcs := func(rev, at, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: at}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
	for _, tc := range []struct {
		name    string
		version string
		info    *debug.BuildInfo
		want    string
	}{
		{"no build info: the version alone", "dev", nil, "dev"},
		{"a checkout's build: revision, time, modified", "dev",
			&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "2026-12-04T09:00:00Z", "true")},
			"dev (a1b2c3d4e5f6, 2026-12-04T09:00:00Z, modified)"},
		{"a clean checkout's build is not modified", "dev",
			&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "2026-12-04T09:00:00Z", "false")},
			"dev (a1b2c3d4e5f6, 2026-12-04T09:00:00Z)"},
		{"go install …@v1.2.3: the module's version", "dev",
			&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}},
			"v1.2.3"},
		{"a pseudo-version already names the revision and time", "dev",
			&debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261204090000-a1b2c3d4e5f6+dirty"}, Settings: vcs(rev, "2026-12-04T09:00:00Z", "true")},
			"v0.0.0-20261204090000-a1b2c3d4e5f6+dirty"},
		{"-ldflags' version wins over the module's, with the revision", "v2.0.0",
			&debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261204090000-a1b2c3d4e5f6"}, Settings: vcs(rev, "2026-12-04T09:00:00Z", "false")},
			"v2.0.0 (a1b2c3d4e5f6, 2026-12-04T09:00:00Z)"},
		{"build info without VCS settings or module version", "dev",
			&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, describeBuild(tc.version, tc.info))
		})
	}
	t.Run("engine version prints it", func(t *testing.T) {
		out := captureStdout(t, func() error { return runVersion(context.Background(), nil) })
		require.Equal(t, buildVersion(), strings.TrimSpace(out))
	})
}
