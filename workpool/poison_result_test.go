package workpool

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// A handler's result or error that Postgres cannot store (jsonb refuses
// \u0000, an unpaired surrogate escape and a number out of numeric's range;
// text refuses NUL and bytes that are not UTF-8) — which a hostile http
// work target chooses — used to fail the statement that records the
// executor's whole batch of results, at every retry: neither that work nor
// any work the executor ran afterwards, of any org, ever finished.
func TestExecutor_AResultOrErrorPostgresCannotStoreFailsOnlyItsOwnWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		result    string
		err       error
		wantError string
	}{
		{"result with \\u0000", `{"a":"x\u0000y"}`, nil, "Postgres cannot store"},
		{"result with an unpaired surrogate", `["\ud800"]`, nil, "Postgres cannot store"},
		{"result with a number out of numeric's range", `1e999999999`, nil, "Postgres cannot store"},
		{"result with bytes that are not UTF-8", "{\"a\":\"caf\xe9\"}", nil, "Postgres cannot store"},
		// (storable, but 10 × 131,072 digits as given back at every read)
		{"result whose numbers print far longer", "[1e131071]", nil, "more than 65536 bytes longer as stored"},
		{"error with NUL", "", NonRetryable(errors.New("bad\x00byte")), "bad\uFFFDbyte"},
		{"error that is not UTF-8", "", NonRetryable(errors.New("bad\xffbyte")), "bad\uFFFDbyte"},
		{"retryable error with a rune cut in half", "", errors.New("cut \xe2\x82"), "cut \uFFFD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, m := newStartedManager(t, Config{Pools: map[string]int{"default": 2}})
			returned := make(chan struct{})
			m.Register("poison", func(context.Context, Job) (json.RawMessage, error) {
				defer close(returned)
				if tc.err != nil {
					return nil, tc.err
				}
				return json.RawMessage(tc.result), nil
			})
			poison := enqueueOn(t, m, EnqueueParams{OrgID: "org-poison", Handler: "poison"})
			<-returned
			other := enqueueOn(t, m, EnqueueParams{OrgID: "org-other", Handler: "noop"})
			requireFinished(t, m, "org-other", other, OutcomeSucceeded)
			st := requireFinished(t, m, "org-poison", poison, OutcomeFailed)
			require.Contains(t, st.Error, tc.wantError)
		})
	}
}
