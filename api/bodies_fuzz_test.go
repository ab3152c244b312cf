package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/approvals"
	"github.com/reveille/reveille/internal/jsonb"
	"github.com/reveille/reveille/mandates"
	"github.com/reveille/reveille/workpool"
)

// bodyDecoder is one JSON request body's decoder, as the fuzz target runs
// it, with what a decoded value must satisfy beyond storable text.
type bodyDecoder struct {
	route  string
	decode func(body []byte) (any, error)
	valid  func(t *testing.T, v any)
	seeds  []string
}

func decoderOf[T any](decode func([]byte) (T, error)) func([]byte) (any, error) {
	return func(b []byte) (any, error) { return decode(b) }
}

// bodyDecoders lists every JSON request body decoder; a new body gets a row.
var bodyDecoders = []bodyDecoder{
	{
		route: "POST /v1/mandates", decode: decoderOf(decodeMandateCreate),
		valid: func(*testing.T, any) {},
		seeds: []string{`{"agent_id": "a1", "scope": "llm", "budget": 100, "valid_until": "2030-01-01T00:00:00Z"}`, `{"budget": -1}`, `{"valid_until": "tomorrow", "budget": 1}`},
	},
	{
		route: "PATCH /v1/mandates/{id}", decode: decoderOf(decodeMandatePatch),
		valid: func(t *testing.T, v any) {
			p := v.(mandates.PatchParams)
			require.False(t, !p.SetValidUntil && p.ValidUntil != nil, "valid_until is set only when given")
		},
		seeds: []string{`{"budget": 5, "status": "revoked", "valid_until": null}`, `{"valid_until": "2030-01-01T00:00:00.5+02:00"}`, `{"valid_until": 5}`, ``},
	},
	{
		route: "POST /v1/mandates/spend", decode: decoderOf(decodeSpend),
		valid: func(t *testing.T, v any) { require.NotNil(t, v.(spendIn).Cost) },
		seeds: []string{`{"agent_id": "a1", "scope": "llm", "cost": 5, "reason": "why"}`, `{"cost": 1e3}`, `{"cost": null}`},
	},
	{
		route: "POST /v1/mandate-approvals/{id}/approve|deny", decode: decoderOf(decodeApprovalResolve),
		valid: func(*testing.T, any) {},
		seeds: []string{`{"note": "ok"}`, ``, `{"note": "\u0000"}`},
	},
	{
		route: "POST /v1/wakeups", decode: decoderOf(decodeWakeup),
		valid: func(t *testing.T, v any) {
			w := v.(wakeupRequest)
			require.NotNil(t, w.Cost)
			require.NotNil(t, w.Work)
		},
		seeds: []string{
			`{"agent_id": "a1", "workflow_id": "org-a/wf", "signal": "wake", "scope": "llm", "reason": "r", "cost": 5, "pool": "wakeup",
			  "work": {"handler": "echo", "args": {"k": [1, "v"]}, "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "base": 2}, "timeout_ms": 100}}`,
			`{"cost": 0, "work": {"args": "\u0000"}}`,
		},
	},
	{
		route: "POST /v1/pools/{pool}/work", decode: decoderOf(decodeWorkEnqueue),
		valid: func(t *testing.T, v any) {
			p := v.(workpool.EnqueueParams)
			require.GreaterOrEqual(t, p.TimeoutMS, 0)
			require.GreaterOrEqual(t, p.KeyLimit, 0, "a key_limit below 1 is refused (0: absent)")
			require.Empty(t, p.OrgID+p.Pool, "the body does not choose the org or the pool")
		},
		seeds: []string{
			`{"handler": "echo", "args": {"a": 1}, "run_at": "2030-01-01T00:00:00Z", "retry": {"max_attempts": 2}, "timeout_ms": 10}`,
			`{"timeout_ms": 0}`, `{"run_at": "2030-13-01T00:00:00Z"}`, `{"args": {"k": "a\u0000"}}`,
			`{"handler": "echo", "concurrency_key": "customer-7", "key_limit": 2}`, `{"key_limit": 0}`,
		},
	},
	{
		route: "PATCH /v1/pools/{pool}", decode: decoderOf(decodePoolPatch),
		valid: func(t *testing.T, v any) {
			u := v.(workpool.PoolUpdate)
			require.True(t, u.MaxParallelism != nil || u.SetMaxParallelismPerOrg || u.ClearOrgWeights || u.OrgWeights != nil,
				"a change changes something")
			require.False(t, !u.SetMaxParallelismPerOrg && u.MaxParallelismPerOrg != nil)
			require.Nil(t, u.Paused, "a PATCH does not pause")
		},
		seeds: []string{`{"max_parallelism": 5, "max_parallelism_per_org": null}`, `{"max_parallelism_per_org": 2}`, `{"max_parallelism_per_org": "2"}`, `{}`,
			`{"org_weights": {"org-7": 3, "org-8": null}}`, `{"org_weights": null}`, `{"org_weights": {"org-7": "3"}}`, `{"org_weights": []}`},
	},
	{
		route: "POST /v1/sessions/{session_id}/tool-calls", decode: decoderOf(decodeToolCall),
		valid: func(t *testing.T, v any) {
			p := v.(approvals.RequestParams)
			require.Empty(t, p.OrgID+p.SessionID+p.IdempotencyKey+p.RequestedBy, "the body does not choose the org, session or caller")
			if p.ExpiresIn != nil {
				// Out of range by at most a second: never an overflowed Duration.
				require.GreaterOrEqual(t, *p.ExpiresIn, -time.Second)
				require.LessOrEqual(t, *p.ExpiresIn, approvals.MaxExpiresIn+time.Second)
			}
		},
		seeds: []string{
			`{"agent_id": "a1", "tool_name": "git", "input": {"repo": "acme/docs"}, "workflow_id": "org-a/wf", "run_id": "r", "signal": "approval", "expires_in_s": 60}`,
			`{"tool_name": "git", "expires_in_s": 9223372036854775807}`, `{"expires_in_s": -9223372036854775808}`, `{"input": null}`,
			`{"input": "\u0000"}`, `{"expires_in_s": 1.5}`,
		},
	},
	{
		route: "POST /v1/sessions/{session_id}/tool-approvals", decode: decoderOf(decodeToolAnswer),
		valid: func(t *testing.T, v any) {
			p := v.(approvals.RespondParams)
			require.Empty(t, p.OrgID+p.SessionID+p.ResolvedBy, "the body does not choose the org, session or resolver")
		},
		seeds: []string{
			`{"tool_name": "git", "decision": "approved", "update_policy": "always", "note": "ok"}`,
			`{"approval_id": "0190a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b", "decision": "denied"}`, `{"approval_id": "nope"}`, `{"approval_id": 5}`,
		},
	},
	{
		route: "PUT /v1/agents/{agent_id}/tool-policies/{tool_name}", decode: decoderOf(decodeToolPolicy),
		valid: func(t *testing.T, v any) {
			p := v.(approvals.PolicyParams)
			require.Empty(t, p.AgentID+p.ToolName+p.UpdatedBy, "the body does not choose the agent, tool or author")
		},
		seeds: []string{`{"approval": "never", "match": {"repo": "acme/docs"}}`, `{"approval": "always", "match": null}`, `{"match": [1]}`, `{"match": {"k": "\u0000"}}`},
	},
}

// FuzzDecodeBodies runs every body decoder on arbitrary bytes: each
// answers a 4xx problem naming a field, or a value whose text Postgres can
// store and that meets the decoder's own rules. It never panics.
func FuzzDecodeBodies(f *testing.F) {
	for i, d := range bodyDecoders {
		for _, s := range d.seeds {
			f.Add(uint8(i), []byte(s))
		}
		f.Add(uint8(i), []byte("{\"agent_id\": \"a\xff\"}"))
		f.Add(uint8(i), []byte(`{"unknown": 1}`))
		f.Add(uint8(i), []byte(`[`))
	}
	f.Add(uint8(0), []byte(`{"a": ["\ud83d\ude00", "\udc00", 1e131072, 0e9999, 1.5e-16383]}`))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		if json.Valid(body) {
			// What the one-pass check refuses, the walk names.
			_, _, found := unstorableJSON(body)
			require.Equal(t, !jsonb.Storable(body), found)
		}
		d := bodyDecoders[int(which)%len(bodyDecoders)]
		v, err := d.decode(body)
		if err != nil {
			requireFieldProblem(t, err)
			return
		}
		requireStorable(t, reflect.ValueOf(v), d.route)
		d.valid(t, v)
	})
}

// FuzzStreamChunks runs the JSON stream append decoder on arbitrary bytes:
// a 4xx problem naming a field, or 1 to the limit of chunks.
func FuzzStreamChunks(f *testing.F) {
	const maxChunks = 4
	f.Add([]byte(`{"chunks": [{"data_base64": "aGk="}, {"data_base64": ""}]}`))
	f.Add([]byte(`{"chunks": [{"data_base64": "aGk"}]}`))
	f.Add([]byte(`{"chunks": [{}, {}, {}, {}, {}]}`))
	f.Add([]byte(`{"chunks": []}`))
	f.Add([]byte(`{"chunks": [{"data_base64": "aG\nk="}]}`))
	f.Add([]byte(`{"chunks": [{"data_base64": 5}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		chunks, err := decodeStreamChunks(body, maxChunks)
		if err != nil {
			requireFieldProblem(t, err)
			return
		}
		require.NotEmpty(t, chunks)
		require.LessOrEqual(t, len(chunks), maxChunks)
		var in streamAppendIn
		require.NoError(t, json.Unmarshal(body, &in))
		for i, c := range chunks {
			require.NotNil(t, c, "an empty chunk is stored as empty, not NULL")
			// The decoder is lenient with line breaks inside base64 only.
			want, err := base64.StdEncoding.DecodeString(strings.NewReplacer("\r", "", "\n", "").Replace(*in.Chunks[i].DataBase64))
			require.NoError(t, err)
			require.Equal(t, want, c)
		}
	})
}

// requireFieldProblem asserts err is a 4xx problem that names at least one
// field, and that it renders.
func requireFieldProblem(t *testing.T, err error) {
	t.Helper()
	var p *Problem
	require.True(t, errors.As(err, &p), "not a problem: %v", err)
	require.Contains(t, []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge}, p.Status)
	require.NotEmpty(t, p.Errors, "the problem names the field: %v", p)
	for _, f := range p.Errors {
		require.NotEmpty(t, f.Field)
	}
	_, err = json.Marshal(p)
	require.NoError(t, err)
}

// requireStorable walks a decoded value: every string is UTF-8 without NUL
// (Postgres text), every []byte is JSON Postgres jsonb accepts (the test
// TestStorableJSONAgreesWithPostgres keeps jsonb.Storable honest).
func requireStorable(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			requireStorable(t, v.Elem(), path)
		}
	case reflect.String:
		require.True(t, isText(v.String()), "%s: %q is not storable text", path, v.String())
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b := v.Bytes()
			if len(b) > 0 {
				require.True(t, json.Valid(b) && utf8.Valid(b), "%s: %q is not JSON", path, b)
				require.True(t, jsonb.Storable(b), "%s: %q is JSON Postgres jsonb refuses", path, b)
			}
			return
		}
		for i := range v.Len() {
			requireStorable(t, v.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				requireStorable(t, v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	}
}
