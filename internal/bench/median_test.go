package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// With the default --rounds 2 each side has two burn-downs: the printed
// "median" was the faster of the two, not their median (their mean, as
// the streams bench's median takes for an even count).
func TestTheMedianOfTwoBurnDownsIsNotTheFasterOne(t *testing.T) {
	got := medianPhase([]fairPhase{{rate: 100}, {rate: 200}})
	require.Equal(t, median([]float64{100, 200}), got.rate)
}
