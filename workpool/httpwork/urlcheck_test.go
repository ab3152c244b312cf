package httpwork

import (
	"errors"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// What a webhook's URL is checked against when it is registered: the
// allow-list, and the address class of an address literal.
func TestURLRulesRefuseWhatTheHandlerWouldRefuseWhateverDNSSays(t *testing.T) {
	rules, err := NewURLRules(Config{
		AllowedHosts: []string{"hooks.example", "127.0.0.1:*", "10.0.0.5:8080", "localhost:*"},
	})
	require.NoError(t, err)
	cases := []struct {
		url    string
		reason string // "" when allowed
	}{
		{"https://hooks.example/a", ""},
		{"http://hooks.example/a", ""},
		{"https://HOOKS.example./a", ""},
		{"http://127.0.0.1:9999/hook", ""},
		{"http://10.0.0.5:8080/hook", ""},
		{"http://localhost:1234/hook", ""},
		{"https://hooks.example:8443/a", "port"},
		{"https://other.example/a", "host"},
		{"http://10.0.0.6:8080/hook", "host"},
		{"http://169.254.169.254/latest/meta-data", "host"},
		{"http://2130706433/", "host"},
		{"ftp://hooks.example/a", "url"},
		{"https:///a", "url"},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			require.NoError(t, err)
			err = rules.CheckURL(u)
			if tc.reason == "" {
				require.NoError(t, err)
				return
			}
			var r *RefusedError
			require.True(t, errors.As(err, &r), "refused: %v", err)
			require.Equal(t, tc.reason, r.Reason)
		})
	}
}

func TestNewURLRulesNamesInvalidEntries(t *testing.T) {
	_, err := NewURLRules(Config{AllowedHosts: []string{"http://x", "a:0"}})
	require.ErrorContains(t, err, `REVEILLE_HTTP_ALLOWED_HOSTS entry "http://x"`)
	require.ErrorContains(t, err, `REVEILLE_HTTP_ALLOWED_HOSTS entry "a:0"`)
}
