package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/workpool/httpwork"
)

// A malformed http allow-list or net stops the service at start, naming the
// variable and the entry, instead of being silently ignored.
func TestEnvConfigRejectsInvalidHTTPNetworkRules(t *testing.T) {
	for _, tc := range []struct {
		name, hosts, nets, contains string
	}{
		{"a URL as a host", "https://api.example.com", "", `REVEILLE_HTTP_ALLOWED_HOSTS entry "https://api.example.com"`},
		{"a bad port", "api.example.com:http", "", `port "http"`},
		{"IPv6 without brackets", "::1", "", "brackets"},
		{"a net that is not a CIDR", "", "10.0.0.0/40", `REVEILLE_HTTP_ALLOWED_NETS entry "10.0.0.0/40"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REVEILLE_HTTP_ALLOWED_HOSTS", tc.hosts)
			t.Setenv("REVEILLE_HTTP_ALLOWED_NETS", tc.nets)
			_, err := envConfig()
			require.ErrorContains(t, err, tc.contains)
		})
	}
	t.Run("the new entry syntax is accepted", func(t *testing.T) {
		t.Setenv("REVEILLE_HTTP_ALLOWED_HOSTS", "api.example.com, api.example.com:8443,localhost:*,[::1]:*,127.0.0.1:*")
		t.Setenv("REVEILLE_HTTP_ALLOWED_NETS", "10.0.0.0/8,fd00::/8")
		s, err := envConfig()
		require.NoError(t, err)
		require.Len(t, s.HTTPAllowed, 5)
		require.Equal(t, []string{"10.0.0.0/8", "fd00::/8"}, s.HTTPNets)
	})
	t.Run("the dev default is valid", func(t *testing.T) {
		_, err := httpwork.ParseAllowList(devHTTPAllowed)
		require.NoError(t, err)
	})
}
