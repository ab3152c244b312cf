package httpwork

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool"
)

// testResolver answers like DNS from a fixed table. It stands in for a DNS
// server because a test cannot make real names resolve to 10.0.0.5 or
// 169.254.169.254 (or be rebound to them); the refusal it exercises is the
// dial check on the address, which is real.
func testResolver(names map[string][]string) LookupFunc {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		addrs, ok := names[strings.TrimSuffix(strings.ToLower(host), ".")]
		if !ok {
			return nil, fmt.Errorf("lookup %s: no such host", host)
		}
		out := make([]netip.Addr, len(addrs))
		for i, a := range addrs {
			out[i] = netip.MustParseAddr(a)
		}
		return out, nil
	}
}

// ssrfTarget is a real HTTP server on 127.0.0.1 that counts the requests it
// serves, so a test can tell a refusal from a request that got through.
type ssrfTarget struct {
	srv  *httptest.Server
	port string
	hits atomic.Int64
}

func newSSRFTarget(t *testing.T) *ssrfTarget {
	tg := &ssrfTarget{}
	tg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); r.URL.Path == "/redirect" && to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		tg.hits.Add(1)
		w.Write([]byte(`{"reached":true}`))
	}))
	t.Cleanup(tg.srv.Close)
	u, err := url.Parse(tg.srv.URL)
	require.NoError(t, err)
	tg.port = u.Port()
	return tg
}

func (tg *ssrfTarget) redirectTo(target string) string {
	return tg.srv.URL + "/redirect?to=" + url.QueryEscape(target)
}

// The network rules: the allow-list decides hosts and ports of the URL and
// of every redirect, the dial check the address connected to. Each row is
// tried directly and as a redirect from an allowed server.
func TestHTTPHandlerRefusesRequestsOutsideTheNetworkRules(t *testing.T) {
	tg := newSSRFTarget(t)
	p := tg.port
	resolver := testResolver(map[string][]string{
		"allowed.example":  {"127.0.0.1"},
		"mixed.example":    {"10.0.0.5", "127.0.0.1"},
		"private.example":  {"10.0.0.5"},
		"metadata.example": {"169.254.169.254"},
		"mapped.example":   {"::ffff:127.0.0.1"},
		"v6loop.example":   {"::1"},
		"cgnat.example":    {"100.64.0.1"},
		"zero.example":     {"0.0.0.0"},
		"nat64.example":    {"64:ff9b::a9fe:a9fe"},
		"evil.example":     {"127.0.0.1"},
	})
	reg := prometheus.NewRegistry()
	h, err := New(Config{
		AllowedHosts: []string{"127.0.0.1:" + p, "allowed.example:*", "mixed.example:*", "private.example:*",
			"metadata.example", "mapped.example", "v6loop.example:*", "cgnat.example:*", "zero.example:*", "nat64.example:*"},
		Lookup:   resolver,
		Registry: reg,
	})
	require.NoError(t, err)

	reached := []struct{ name, url string }{
		{"a listed address and port", "http://127.0.0.1:" + p + "/"},
		{"a listed name resolving to a listed address and port", "http://allowed.example:" + p + "/"},
		{"a listed name in capitals with a trailing dot", "http://ALLOWED.Example.:" + p + "/"},
		{"the listed address in IPv4-mapped IPv6 notation", "http://[::ffff:127.0.0.1]:" + p + "/"},
		{"the listed address in hex IPv4-mapped notation", "http://[::ffff:7f00:1]:" + p + "/"},
		{"a name with a private and an allowed address reaches the allowed one", "http://mixed.example:" + p + "/"},
	}
	for _, tc := range reached {
		for _, via := range []string{"direct", "redirect"} {
			t.Run(via+": "+tc.name, func(t *testing.T) {
				target := tc.url
				if via == "redirect" {
					target = tg.redirectTo(tc.url)
				}
				before := tg.hits.Load()
				res, err := run(t, h, context.Background(), Args{URL: target})
				require.NoError(t, err)
				require.Equal(t, 200, res.Status)
				require.Equal(t, before+1, tg.hits.Load())
			})
		}
	}

	refusedRows := []struct {
		name, url, reason, contains string
	}{
		// The allow-list: host and port.
		{"an unlisted port of a listed address", "http://127.0.0.1:1/", "port", `"127.0.0.1:1"`},
		{"port 80 of the listed address in mapped notation", "http://[::ffff:7f00:1]/", "port", `"[::ffff:7f00:1]:80"`},
		{"an entry without a port allows 80 and 443 only", "http://metadata.example:8080/", "port", "80 and 443"},
		{"localhost is not 127.0.0.1", "http://localhost:" + p + "/", "host", `"localhost:` + p + `"`},
		{"another loopback address", "http://127.0.0.2:" + p + "/", "host", "127.0.0.2"},
		{"IPv6 loopback", "http://[::1]:" + p + "/", "host", `"[::1]:` + p + `"`},
		{"IPv4-mapped 10.0.0.5", "http://[::ffff:a00:5]/", "host", "::ffff:a00:5"},
		{"the metadata address", "http://169.254.169.254/latest/meta-data/", "host", "169.254.169.254"},
		{"an IPv6 link-local address with a zone", "http://[fe80::1%25eth0]:" + p + "/", "host", "fe80::1%eth0"},
		{"decimal IPv4", "http://2130706433:" + p + "/", "host", "non-standard notation"},
		{"hex IPv4", "http://0x7f000001:" + p + "/", "host", "non-standard notation"},
		{"octal IPv4", "http://0177.0.0.1:" + p + "/", "host", "non-standard notation"},
		{"short IPv4", "http://127.1:" + p + "/", "host", "non-standard notation"},
		{"an allowed name as userinfo", "http://allowed.example@127.0.0.2:" + p + "/", "host", "127.0.0.2"},
		{"an allowed address and port as userinfo", "http://127.0.0.1:" + p + "@169.254.169.254/", "host", "169.254.169.254"},
		{"an allowed name as a subdomain", "http://allowed.example.evil.example:" + p + "/", "host", "allowed.example.evil.example"},
		{"an allowed name after a fragment", "http://evil.example:" + p + "#@allowed.example/", "host", "evil.example"},
		{"two trailing dots", "http://allowed.example..:" + p + "/", "host", "allowed.example.."},
		{"port 0", "http://127.0.0.1:0/", "url", "port"},
		// The dial check: a listed name whose address is not allowed.
		{"a name resolving to a private address", "http://private.example/", "private",
			"10.0.0.5 is a private address; allow it with REVEILLE_HTTP_ALLOWED_NETS"},
		{"a name resolving to the metadata address", "http://metadata.example/latest/meta-data/", "link_local", "169.254.169.254"},
		{"a name resolving to IPv4-mapped loopback", "http://mapped.example/", "loopback", "127.0.0.1 is a loopback address"},
		{"a name resolving to IPv6 loopback", "http://v6loop.example:" + p + "/", "loopback", "::1 is a loopback address"},
		{"a name resolving to CGNAT", "http://cgnat.example/", "cgnat", "100.64.0.1"},
		{"a name resolving to 0.0.0.0", "http://zero.example:" + p + "/", "unspecified", "0.0.0.0"},
		{"a name resolving to NAT64 of the metadata address", "http://nat64.example/", "link_local", "64:ff9b::a9fe:a9fe"},
		{"a listed name resolving to the listed address on another port", "http://allowed.example/", "loopback", "127.0.0.1"},
	}
	for _, tc := range refusedRows {
		for _, via := range []string{"direct", "redirect"} {
			t.Run(via+": "+tc.name, func(t *testing.T) {
				target := tc.url
				if via == "redirect" {
					target = tg.redirectTo(tc.url)
				}
				before := tg.hits.Load()
				_, err := run(t, h, context.Background(), Args{URL: target})
				require.Error(t, err)
				require.True(t, workpool.IsNonRetryable(err), "a refusal is final: %v", err)
				var r *RefusedError
				require.True(t, errors.As(err, &r), "want a *RefusedError, got %v", err)
				require.Equal(t, tc.reason, r.Reason, "%v", err)
				require.ErrorContains(t, err, tc.contains)
				require.Equal(t, before, tg.hits.Load(), "the target was reached")
			})
		}
	}

	t.Run("refusals are counted by reason", func(t *testing.T) {
		want := map[string]float64{}
		for _, tc := range refusedRows {
			want[tc.reason] += 2 // direct and redirect
		}
		for reason, n := range want {
			require.Equal(t, n, counterValue(t, reg, "reveille_http_work_refused_total", reason), reason)
		}
	})
}

// REVEILLE_HTTP_ALLOWED_NETS lifts the address refusal for its nets only;
// a listed name is not enough.
func TestHTTPHandlerConnectsToSpecialAddressesOnlyInAllowedNets(t *testing.T) {
	tg := newSSRFTarget(t)
	resolver := testResolver(map[string][]string{"allowed.example": {"127.0.0.1"}})
	for _, tc := range []struct {
		name    string
		nets    []string
		reached bool
	}{
		{"no allowed nets", nil, false},
		{"another net", []string{"10.0.0.0/8", "::1/128"}, false},
		{"the loopback net", []string{"127.0.0.0/8"}, true},
		{"the address alone", []string{"127.0.0.1"}, true},
		{"the loopback net in IPv4-mapped notation", []string{"::ffff:127.0.0.0/104"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := New(Config{AllowedHosts: []string{"allowed.example:*"}, AllowedNets: tc.nets, Lookup: resolver})
			require.NoError(t, err)
			before := tg.hits.Load()
			_, err = run(t, h, context.Background(), Args{URL: "http://allowed.example:" + tg.port + "/"})
			if tc.reached {
				require.NoError(t, err)
				require.Equal(t, before+1, tg.hits.Load())
				return
			}
			require.True(t, workpool.IsNonRetryable(err), "%v", err)
			require.ErrorContains(t, err, "127.0.0.1 is a loopback address; allow it with REVEILLE_HTTP_ALLOWED_NETS")
			require.Equal(t, before, tg.hits.Load())
		})
	}
}

// The default of `engine dev`, the demo and the benches, with the system
// resolver: localhost reaches a server on 127.0.0.1 because 127.0.0.1 is
// listed (its IPv6 address ::1, if it has one, is skipped as not listed).
func TestHTTPHandlerDevDefaultReachesLocalhost(t *testing.T) {
	tg := newSSRFTarget(t)
	h, err := New(Config{AllowedHosts: []string{"localhost:*", "127.0.0.1:*"}})
	require.NoError(t, err)
	for _, u := range []string{"http://localhost:" + tg.port + "/", "http://127.0.0.1:" + tg.port + "/"} {
		res, err := run(t, h, context.Background(), Args{URL: u})
		require.NoError(t, err, u)
		require.Equal(t, 200, res.Status)
	}
	require.EqualValues(t, 2, tg.hits.Load())
}

func TestInvalidAllowListEntriesFailTheConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		contains string
	}{
		{"a URL", Config{AllowedHosts: []string{"https://example.com"}}, "no scheme"},
		{"a path", Config{AllowedHosts: []string{"example.com/x"}}, "no scheme"},
		{"an empty entry", Config{AllowedHosts: []string{" "}}, "empty entry"},
		{"an empty port", Config{AllowedHosts: []string{"example.com:"}}, "empty port"},
		{"port 0", Config{AllowedHosts: []string{"example.com:0"}}, `port "0"`},
		{"a port out of range", Config{AllowedHosts: []string{"example.com:65536"}}, `port "65536"`},
		{"a named port", Config{AllowedHosts: []string{"example.com:http"}}, `port "http"`},
		{"a wildcard host", Config{AllowedHosts: []string{"*.example.com"}}, "not a valid host name"},
		{"IPv6 without brackets", Config{AllowedHosts: []string{"::1"}}, "brackets"},
		{"IPv4 in brackets", Config{AllowedHosts: []string{"[127.0.0.1]:*"}}, "IPv6"},
		{"an unclosed bracket", Config{AllowedHosts: []string{"[::1:*"}}, "unclosed"},
		{"decimal IPv4", Config{AllowedHosts: []string{"2130706433"}}, "dotted-decimal"},
		{"octal IPv4", Config{AllowedHosts: []string{"0177.0.0.1:*"}}, "dotted-decimal"},
		{"a net that is not a CIDR", Config{AllowedNets: []string{"10.0.0.0/33"}}, "REVEILLE_HTTP_ALLOWED_NETS entry \"10.0.0.0/33\""},
		{"a host as a net", Config{AllowedNets: []string{"localhost"}}, "want a CIDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	t.Run("every invalid entry is named", func(t *testing.T) {
		_, err := New(Config{AllowedHosts: []string{"ok.example", "bad/one", "ok.example:*", "::2"}})
		require.ErrorContains(t, err, `"bad/one"`)
		require.ErrorContains(t, err, `"::2"`)
		require.NotContains(t, err.Error(), `"ok.example"`)
	})
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
