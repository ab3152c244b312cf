package client_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/client"
)

// Set(weights) with weights a nil map — "set no weights", e.g. a map built
// only when some condition holds — must not clear every org's weight: the
// doc says only Null[map…]() does that.
func TestPoolsUpdateWithASetNilWeightMapKeepsEveryOrgsWeight(t *testing.T) {
	e := startEngine(t)
	ctx := context.Background()
	asOperator := newClient(t, e.url, operator, nil)
	three := 3
	_, err := asOperator.Pools.Update(ctx, "default", client.PoolUpdate{OrgWeights: client.Set(map[string]*int{"org-w": &three})})
	require.NoError(t, err)

	var none map[string]*int // nothing to change this time
	six := 6
	p, err := asOperator.Pools.Update(ctx, "default", client.PoolUpdate{MaxParallelism: &six, OrgWeights: client.Set(none)})
	require.NoError(t, err)
	require.Equal(t, 6, p.MaxParallelism)
	require.Equal(t, map[string]int{"org-w": 3}, p.OrgWeights, "Set(a nil map) cleared every org's weight")
}
