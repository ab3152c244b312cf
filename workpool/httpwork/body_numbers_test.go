package httpwork

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/workpool"
)

// A 2xx JSON body whose numbers jsonb would give back far longer is kept
// as a string, inside {status, headers, body}, and the work succeeds: a
// body kept as JSON within 1 MiB as printed, whose wrapper then took the
// result past the result limit as printed, failed the work for good for a
// 73-byte body that fits many times over as a string.
func TestAJSONBodyWhoseNumbersPrintFarLongerDoesNotFailTheWork(t *testing.T) {
	prefix := "[" + strings.Repeat("1e131071,", 7) + "1e"
	k := MaxResponseBytes - 20 - jsonb.TextLen([]byte(prefix+"0]")) // printed 20 bytes under the cap
	body := prefix + strconv.Itoa(k) + "]"
	require.LessOrEqual(t, jsonb.TextLen([]byte(body)), MaxResponseBytes)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	defer srv.Close()
	st := runInPool(t, srv.URL, nil)
	require.Equal(t, workpool.OutcomeSucceeded, st.Outcome, "a %d-byte body: %s", len(body), st.Error)
}
