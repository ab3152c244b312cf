package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEnvConfigReadsTheRequestLimits(t *testing.T) {
	vars := []string{"REVEILLE_READ_HEADER_TIMEOUT", "REVEILLE_READ_TIMEOUT", "REVEILLE_IDLE_TIMEOUT", "REVEILLE_ORG_RATE", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST"}
	for _, v := range vars {
		t.Setenv(v, "")
	}
	s, err := envConfig()
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, s.HeaderTimeout)
	require.Equal(t, 60*time.Second, s.ReadTimeout)
	require.Equal(t, 120*time.Second, s.IdleTimeout)
	require.Equal(t, 10_000.0, s.OrgRate)
	require.Equal(t, 1000, s.StreamChunks)

	for v, val := range map[string]string{"REVEILLE_READ_HEADER_TIMEOUT": "2s", "REVEILLE_READ_TIMEOUT": "30s", "REVEILLE_IDLE_TIMEOUT": "1m",
		"REVEILLE_ORG_RATE": "0", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "50"} {
		t.Setenv(v, val)
	}
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, s.HeaderTimeout)
	require.Equal(t, 30*time.Second, s.ReadTimeout)
	require.Equal(t, time.Minute, s.IdleTimeout)
	require.Zero(t, s.OrgRate, "0 turns the rate limit off")
	require.Equal(t, 50, s.StreamChunks)

	t.Setenv("REVEILLE_ORG_RATE", "2.5")
	s, err = envConfig()
	require.NoError(t, err)
	require.Equal(t, 2.5, s.OrgRate)

	for v, bad := range map[string]string{"REVEILLE_READ_TIMEOUT": "soon", "REVEILLE_ORG_RATE": "-1", "REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST": "0"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv(v, bad)
			_, err := envConfig()
			require.ErrorContains(t, err, v)
		})
	}
	t.Setenv("REVEILLE_ORG_RATE", "NaN")
	_, err = envConfig()
	require.ErrorContains(t, err, "REVEILLE_ORG_RATE")
}
