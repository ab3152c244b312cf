package main

import (
	"runtime/debug"
	"strings"
)

// version is set at build time (-ldflags "-X main.version=…").
var version = "dev"

// buildVersion is what engine version prints and serve logs as it starts.
// "dev" alone named every build made without -ldflags, so the build's own
// record is added when the binary has one (runtime/debug.ReadBuildInfo).
func buildVersion() string {
	info, _ := debug.ReadBuildInfo()
	return describeBuild(version, info)
}

// describeBuild is v, or — v being "dev" — the module's version when the
// go command recorded one (go install …@v1.2.3), followed by the VCS
// revision, commit time and "modified" (uncommitted changes) that go build
// stamps in a checkout: `dev (a1b2c3d4e5f6, 2026-12-04T09:00:00Z,
// modified)`. A pseudo-version (go build in a checkout, since Go 1.24)
// already names the revision and time, so it is printed alone. Without
// build info (info nil) it is v.
func describeBuild(v string, info *debug.BuildInfo) string {
	if info == nil {
		return v
	}
	if mv := info.Main.Version; v == "dev" && mv != "" && mv != "(devel)" {
		v = mv
	}
	var rev, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	rev = rev[:min(len(rev), 12)]
	if rev != "" && strings.Contains(v, rev) {
		return v
	}
	var parts []string
	for _, p := range []string{rev, at} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if modified {
		parts = append(parts, "modified")
	}
	if len(parts) == 0 {
		return v
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}
