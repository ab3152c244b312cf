package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// README's "A second replica" command is copied next to a running
// `engine dev`: it must set what dev sets beyond serve's defaults, else
// the replica answers the same request differently (dev's token, whose
// operator role counts on dev because dev defaults REVEILLE_OPERATOR_ORGS
// to dev-org, is 403 on the replica for PATCH /v1/pools/{pool}).
func TestTheREADMEsSecondReplicaSetsWhatDevSets(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, line, ok := strings.Cut(string(readme), "\nA second replica: `")
	require.True(t, ok, "the README's second replica command")
	line, _, _ = strings.Cut(line, "`")

	require.Contains(t, line, "REVEILLE_HTTP_ALLOWED_HOSTS='"+strings.Join(devHTTPAllowed, ",")+"'")
	require.Contains(t, line, "REVEILLE_OPERATOR_ORGS="+devOrg, "dev's default operator org")
}
