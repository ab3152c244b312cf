package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkRequestPipeline is the per-request cost of the /v1 middleware —
// token verification, role check, parameter check and the per-org rate
// limiter — on GET /v1/whoami, which touches no database. The rate limiter
// is set out of reach so that every request is admitted.
//
//	go test -run '^$' -bench RequestPipeline -count 6 ./api/
func BenchmarkRequestPipeline(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate float64
	}{{"rate-limit-off", 0}, {"rate-limit-on", 1e9}} {
		b.Run(bc.name, func(b *testing.B) {
			s := newTestServer(b, func(c *Config, _ *Services) { c.OrgRate = bc.rate })
			tok, err := SignToken(testSecret, TokenSpec{OrgID: "org-a", Sub: "u", Roles: []string{RoleAgent}, TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			h := s.Handler()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, "/v1/whoami?x=1", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
