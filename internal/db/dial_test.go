package db

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// BoundNetwork sends the server the network bounds a URL does not set
// itself — as a parameter or in its options (-c name=value, --name=value:
// the server applies a startup parameter after options, so one sent
// anyway would override the URL's choice; found by review).
func TestTheNetworkBoundsAURLSetsItselfAreNotSent(t *testing.T) {
	for _, tc := range []struct {
		url   string
		owned string // the parameter the URL sets, left to it
	}{
		{"postgres://u@h/d?tcp_keepalives_idle=60", "tcp_keepalives_idle"},
		{"postgres://u@h/d?options=-c%20tcp_keepalives_idle%3D60", "tcp_keepalives_idle"},
		{"postgres://u@h/d?options=-ctcp_user_timeout%3D0", "tcp_user_timeout"},
		{"postgres://u@h/d?options=--tcp-keepalives-count%3D9%20-c%20jit%3Doff", "tcp_keepalives_count"},
		{"postgres://u@h/d?options=-c%20TCP_KEEPALIVES_INTERVAL%3D1", "tcp_keepalives_interval"},
		{"postgres://u@h/d?options=-c%20jit%3Doff", ""},
		{"postgres://u@h/d?TCP_KEEPALIVES_IDLE=60", "tcp_keepalives_idle"},
		// (a backslash takes the next character as it is, as the server
		// reads options: the first is one value, application_name's; the
		// second names tcp_keepalives_idle)
		{`postgres://u@h/d?options=-c%20application_name%3Da%5C%20-ctcp_keepalives_idle%3D60`, ""},
		{`postgres://u@h/d?options=-c%20tcp_keepalives%5C_idle%3D60`, "tcp_keepalives_idle"},
		// (only ASCII whitespace splits: a no-break space is part of the value)
		{`postgres://u@h/d?options=-c%20application_name%3Da%C2%A0-ctcp_keepalives_idle%3D60`, ""},
		{"postgres://u@h/d", ""},
	} {
		t.Run(tc.url, func(t *testing.T) {
			cc, err := pgx.ParseConfig(tc.url)
			require.NoError(t, err)
			options := cc.RuntimeParams["options"]
			BoundNetwork(cc)
			require.NotNil(t, cc.DialFunc)
			require.Equal(t, options, cc.RuntimeParams["options"], "the options untouched")
			for k, v := range ServerSessionParams() {
				switch {
				case k != tc.owned:
					require.Equal(t, v, cc.RuntimeParams[k], k)
				case strings.Contains(tc.url, "?tcp_keepalives_idle=60"), strings.Contains(tc.url, "?TCP_KEEPALIVES_IDLE=60"):
					require.NotEqual(t, v, cc.RuntimeParams[k], "the URL's parameter wins, in any case")
				default:
					require.NotContains(t, cc.RuntimeParams, k, "left to the options")
				}
			}
		})
	}
}
