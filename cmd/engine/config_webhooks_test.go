package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/webhooks"
)

func TestEnvConfigHandsTheWebhooksTheirPoolAndPublicURL(t *testing.T) {
	cases := []struct {
		name                 string
		pools, pool, public  string
		wantPool, wantPublic string
	}{
		{name: "the defaults", wantPool: "default"},
		{name: "a pool of REVEILLE_POOLS", pools: "default=5,hooks=2,wakeup=1", pool: "hooks", wantPool: "hooks"},
		{name: "pools without default: the first by name", pools: "zeta=1,alpha=2,wakeup=1", wantPool: "alpha"},
		// (its slots are the wake-ups': deliveries and their retries took them)
		{name: "pools without default: never the wake-up pool", pools: "wakeup=25,workers=10", wantPool: "workers"},
		{name: "a public URL, its trailing slash dropped", public: "https://reveille.example.com/", wantPool: "default",
			wantPublic: "https://reveille.example.com"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("REVEILLE_POOLS", tc.pools)
			t.Setenv("REVEILLE_WEBHOOK_POOL", tc.pool)
			t.Setenv("REVEILLE_PUBLIC_URL", tc.public)
			s, err := envConfig()
			require.NoError(t, err)
			require.Equal(t, webhooks.Config{Pool: tc.wantPool, PublicURL: tc.wantPublic}, s.serviceConfig(testkit.Logger(t)).Webhooks)
		})
	}
}

func TestEnvConfigNamesABadWebhookSetting(t *testing.T) {
	for _, tc := range []struct{ name, value, contains string }{
		{"REVEILLE_WEBHOOK_POOL", "nope", `REVEILLE_WEBHOOK_POOL="nope": not one of REVEILLE_POOLS' pools (default, wakeup)`},
		{"REVEILLE_WEBHOOK_POOL", "wakeup", `REVEILLE_WEBHOOK_POOL="wakeup": that pool runs wake-ups' work only`},
		{"REVEILLE_PUBLIC_URL", "reveille.example.com", `REVEILLE_PUBLIC_URL="reveille.example.com"`},
		{"REVEILLE_PUBLIC_URL", "ftp://reveille.example.com", "REVEILLE_PUBLIC_URL"},
		{"REVEILLE_PUBLIC_URL", "https://reveille.example.com/?a=1", "REVEILLE_PUBLIC_URL"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.name, tc.value)
			_, err := envConfig()
			require.ErrorContains(t, err, tc.contains)
		})
	}
}

// REVEILLE_POOLS with the wake-up pool alone leaves no pool for approval
// webhooks (never the wake-up pool): the start is refused, naming it. It
// went on with "default", a pool REVEILLE_POOLS does not create, and every
// delivery's enqueue then failed the tool call or overrun request whose
// transaction made it.
func TestEnvConfigRefusesPoolsWithNoneForTheWebhooks(t *testing.T) {
	clearEnv(t)
	t.Setenv("REVEILLE_POOLS", "wakeup=25")
	_, err := envConfig()
	require.ErrorContains(t, err, "REVEILLE_POOLS has no pool for approval webhooks (wakeup runs wake-ups' work only): add one")
}
