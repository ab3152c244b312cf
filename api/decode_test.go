package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

// An unknown field is named by its dotted path, as every other field
// problem is: in a large body the key alone does not say which object
// holds it.
func TestAnUnknownFieldIsNamedByItsPath(t *testing.T) {
	type retry struct {
		MaxAttempts int `json:"max_attempts"`
	}
	type common struct {
		Pool string `json:"pool"`
	}
	type body struct {
		common
		Work struct {
			Handler string `json:"handler"`
			Retry   *retry `json:"retry"`
			Args    any    `json:"args"`
		} `json:"work"`
		Chunks []struct {
			Data string `json:"data_base64"`
		} `json:"chunks"`
		Weights map[string]*retry `json:"weights"`
		Skip    string            `json:"-"`
	}
	for _, tc := range []struct{ name, body, field string }{
		{"at the top", `{"extra": 1}`, "extra"},
		{"in a nested object", `{"work": {"handler": "h", "extra": 1}}`, "work.extra"},
		{"two levels down", `{"work": {"retry": {"max_attempts": 1, "extra": 1}}}`, "work.retry.extra"},
		{"in an array's element", `{"chunks": [{"data_base64": "YQ=="}, {"x": 1}]}`, "chunks[1].x"},
		{"in a map's value", `{"weights": {"org-7": {"extra": 1}}}`, "weights.org-7.extra"},
		{"a field json ignores", `{"Skip": "x"}`, "Skip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst body
			err := decodeJSON([]byte(tc.body), &dst)
			var p *Problem
			require.True(t, errors.As(err, &p), "%v", err)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: "unknown field"}}, p.Errors)
		})
	}
	var dst body
	require.NoError(t, decodeJSON([]byte(`{"pool": "p", "work": {"args": {"anything": {"goes": 1}}}}`), &dst))
}

// keyedBody is a request body with each kind of value a key walk meets: a
// field, a struct, raw JSON, a slice of structs and a map.
type keyedBody struct {
	Pool string `json:"pool"`
	Work *struct {
		Handler string          `json:"handler"`
		Args    json.RawMessage `json:"args"`
	} `json:"work"`
	Chunks []struct {
		Data string `json:"data_base64"`
	} `json:"chunks"`
	Weights map[string]int `json:"weights"`
}

// encoding/json matches keys to fields case-insensitively and keeps a
// repeated key's last value; the document's names are exact, and a key
// given twice reads as two requests (a proxy or a log may take the first).
func TestAKeyInAnotherCaseOrGivenTwiceIsRefusedNamingIt(t *testing.T) {
	for _, tc := range []struct{ name, body, field, detail string }{
		{"a key in upper case", `{"POOL": "p"}`, "POOL", `unknown field (names are case-sensitive: "pool")`},
		{"a nested key in another case", `{"work": {"Handler": "h"}}`, "work.Handler", `unknown field (names are case-sensitive: "handler")`},
		{"in an array's element", `{"chunks": [{"data_base64": "YQ=="}, {"Data_Base64": "YQ=="}]}`, "chunks[1].Data_Base64",
			`unknown field (names are case-sensitive: "data_base64")`},
		{"a key given twice", `{"pool": "a", "pool": "b"}`, "pool", "is given twice"},
		{"a key given twice, in another case the second time", `{"pool": "a", "Pool": "b"}`, "Pool", `unknown field (names are case-sensitive: "pool")`},
		{"a map's key given twice", `{"weights": {"org-1": 1, "org-1": 2}}`, "weights.org-1", "is given twice"},
		{"a key given twice inside raw args", `{"work": {"args": {"a": [{"b": 1, "b": 2}]}}}`, "work.args.a[0].b", "is given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst keyedBody
			err := decodeJSON([]byte(tc.body), &dst)
			var p *Problem
			require.True(t, errors.As(err, &p), "%v", err)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: tc.detail}}, p.Errors)
		})
	}
	for _, ok := range []string{
		`{"weights": {"org-1": 1, "Org-1": 2}}`, // (a map's keys are data: case counts)
		`{"work": {"args": {"A": 1, "a": 2}}}`,
		`{"chunks": [{"data_base64": "YQ=="}, {"data_base64": "YQ=="}]}`,
	} {
		var dst keyedBody
		require.NoError(t, decodeJSON([]byte(ok), &dst), ok)
	}
}

func TestAValueOfTheWrongTypeIsNamedByItsPath(t *testing.T) {
	type body struct {
		Work struct {
			Retry *struct {
				MaxAttempts int `json:"max_attempts"`
			} `json:"retry"`
		} `json:"work"`
		Chunks []struct {
			Data string `json:"data_base64"`
			Tags []int  `json:"tags"`
		} `json:"chunks"`
		Weights map[string]*int `json:"weights"`
		Matrix  [][]int         `json:"matrix"`
	}
	for _, tc := range []struct{ name, body, field, detail string }{
		{"at the top", `{"chunks": {}}`, "chunks", "must be an array, not object"},
		{"in a nested object", `{"work": {"retry": {"max_attempts": "3"}}}`, "work.retry.max_attempts", "must be an integer in range, not string"},
		{"in an array's element", `{"chunks": [{"data_base64": "YQ=="}, {"data_base64": 5}]}`, "chunks[1].data_base64", "must be a string, not number"},
		{"an array's element itself", `{"chunks": [{}, {}, 7]}`, "chunks[2]", "must be an object, not number"},
		{"an object where a string goes", `{"chunks": [{"data_base64": {"a": [1]}}]}`, "chunks[0].data_base64", "must be a string, not object"},
		{"deep in arrays", `{"chunks": [{"tags": [1, 2]}, {"tags": [3, 4.5]}]}`, "chunks[1].tags[1]", "must be an integer in range, not number 4.5"},
		{"an array of arrays", `{"matrix": [[1], [2, "x"]]}`, "matrix[1][1]", "must be an integer in range, not string"},
		{"in a map's value", `{"weights": {"a": 1, "b": "2"}}`, "weights.b", "must be an integer in range, not string"},
		{"keys spelt in another case", `{"CHUNKS": [{"Data_Base64": 1}]}`, "CHUNKS[0].Data_Base64", "must be a string, not number"},
		{"after whitespace and escapes", "  {\"chunks\" : [ {\"data_base64\": \"\\\"]\"} , {\"data_base64\" : true} ] }", "chunks[1].data_base64", "must be a string, not bool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst body
			err := decodeJSON([]byte(tc.body), &dst)
			var p *Problem
			require.True(t, errors.As(err, &p), "%v", err)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: tc.detail}}, p.Errors)
		})
	}
}

func TestAWakeupWithAnUnknownFieldInItsWorkNamesItsPath(t *testing.T) {
	s := newTestServer(t, withWakeups(t))
	body := map[string]any{
		"agent_id": "a1", "workflow_id": "org-a/wf-1", "signal": "wake", "scope": "llm", "cost": 1,
		"work": map[string]any{"handler": "echo", "extra": 1},
	}
	do(t, s.Handler(), http.MethodPost, "/v1/wakeups", token(t, "org-a", "agent"), body).requireProblem(t, http.StatusBadRequest, "work.extra")
}

// FuzzMisnamedKeyAgreesWithTheDecodersTokens checks the walk that finds a
// key in another case or given twice — a scanner over bytes, since it runs
// on every body — against the same rule read through encoding/json's
// tokens, on any body the decoder accepts.
func FuzzMisnamedKeyAgreesWithTheDecodersTokens(f *testing.F) {
	for _, seed := range []string{
		`{"pool": "p", "work": {"handler": "h", "args": {"a": [1, {"b": null}], "A": "x\"y"}}}`,
		`{"POOL": "p"}`, `{"pool": "a", "pool": "b"}`, `{"weights": {"a": 1, "a": 2}}`,
		`{"chunks": [{"data_base64": ""}, {"Data_base64": ""}]}`, ` { "\u0070ool" : "x" , "pool":"y" } `,
		`{"work": {"args": {"\"": 1, "\\": 2, "\"": 3}}}`, `{"work": {"args": [[], {}, "", 1e5, true]}}`,
		`{"weights": {"k1": 1, "k2": 2, "k3": 3, "k4": 4, "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": 9, "k10": 10,
		  "k11": 11, "k12": 12, "k13": 13, "k14": 14, "k15": 15, "k16": 16, "k17": 17, "k3": 0}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var dst keyedBody
		if !utf8.Valid(b) || json.Unmarshal(b, &dst) != nil { // (decodeJSON's conditions before the walk)
			return
		}
		path, detail, found := misnamedKey(b, reflect.TypeOf(&dst))
		wantPath, wantDetail, wantFound := misnamedKeyByTokens(t, b, reflect.TypeOf(&dst))
		require.Equal(t, wantFound, found, "%s", b)
		require.Equal(t, wantPath, path, "%s", b)
		require.Equal(t, wantDetail, detail, "%s", b)
	})
}

// misnamedKeyByTokens is misnamedKey's rule through the decoder's tokens.
func misnamedKeyByTokens(t *testing.T, b []byte, typ reflect.Type) (string, string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func(typ reflect.Type, path string) (string, string, bool)
	walk = func(typ reflect.Type, path string) (string, string, bool) {
		tok, err := dec.Token()
		require.NoError(t, err)
		fields, elem := walkTypes(typ)
		join := func(key string) string {
			if path == "" {
				return key
			}
			return path + "." + key
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				tok, err := dec.Token()
				require.NoError(t, err)
				key := tok.(string)
				if seen[key] {
					return join(key), "is given twice", true
				}
				seen[key] = true
				valueType := elem
				if fields != nil {
					ft, ok := fields[key]
					for name := range fields {
						if !ok && strings.EqualFold(name, key) {
							return join(key), fmt.Sprintf("unknown field (names are case-sensitive: %q)", name), true
						}
					}
					valueType = ft
				}
				if p, d, found := walk(valueType, join(key)); found {
					return p, d, true
				}
			}
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if p, d, found := walk(elem, path+"["+strconv.Itoa(i)+"]"); found {
					return p, d, true
				}
			}
		default:
			return "", "", false
		}
		_, err = dec.Token()
		require.NoError(t, err)
		return "", "", false
	}
	return walk(typ, "")
}

// Only white space may follow the body's one value: a stray "}" or "]"
// after it (which json.Decoder.More does not report) is refused, as any
// other second value is, and is no part of an Idempotency-Key's match.
func TestAnythingButSpaceAfterTheBodyIsRefused(t *testing.T) {
	type body struct {
		Pool string `json:"pool"`
	}
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"one value", `{"pool":"p"}`, true},
		{"white space after it", "{\"pool\":\"p\"} \t\r\n", true},
		{"a stray brace", `{"pool":"p"}}`, false},
		{"stray brackets", `{"pool":"p"} ]]]}`, false},
		{"a second value", `{"pool":"p"} {}`, false},
		{"a word", `{"pool":"p"} x`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst body
			err := decodeJSON([]byte(tc.body), &dst)
			if tc.ok {
				require.NoError(t, err)
				require.Equal(t, "p", dst.Pool)
				require.True(t, fingerprintRequest("application/json", []byte(tc.body)).matches(fingerprintRequest("application/json", []byte(`{"pool":"p"}`))))
				return
			}
			var p *Problem
			require.ErrorAs(t, err, &p)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: "body", Detail: "the body holds more than one JSON value"}}, p.Errors)
			require.False(t, fingerprintRequest("application/json", []byte(tc.body)).matches(fingerprintRequest("application/json", []byte(`{"pool":"p"}`))),
				"matches the body without what follows")
		})
	}
}

func TestANullTheDocumentDoesNotAllowIsRefusedNamingTheField(t *testing.T) {
	work := func(b []byte) error { _, err := decodeWorkEnqueue(b); return err }
	wakeup := func(b []byte) error { _, err := decodeWakeup(b); return err }
	spend := func(b []byte) error { _, err := decodeSpend(b); return err }
	mandate := func(b []byte) error { _, err := decodeMandateCreate(b); return err }
	patch := func(b []byte) error { _, err := decodeMandatePatch(b); return err }
	toolCall := func(b []byte) error { _, err := decodeToolCall(b); return err }
	const wake = `"agent_id": "a", "workflow_id": "o/w", "signal": "s", "scope": "x", "cost": 1`
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		body   string
		field  string
	}{
		{"run_at", work, `{"handler": "h", "run_at": null}`, "run_at"},
		{"retry", work, `{"handler": "h", "retry": null}`, "retry"},
		{"a field of retry", work, `{"handler": "h", "retry": {"max_attempts": 2, "base": null}}`, "retry.base"},
		{"timeout_ms", work, `{"handler": "h", "timeout_ms": null}`, "timeout_ms"},
		{"a wake-up's reason", wakeup, `{` + wake + `, "reason": null, "work": {"handler": "h"}}`, "reason"},
		{"a wake-up's work timeout", wakeup, `{` + wake + `, "work": {"handler": "h", "timeout_ms": null}}`, "work.timeout_ms"},
		{"a patch's budget", patch, `{"budget": null}`, "budget"},
		{"a tool call's expires_in_s", toolCall, `{"tool_name": "t", "expires_in_s": null}`, "expires_in_s"},
	} {
		t.Run(tc.name+" of null", func(t *testing.T) {
			var p *Problem
			require.ErrorAs(t, tc.decode([]byte(tc.body)), &p)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: nullDetail}}, p.Errors)
		})
	}
	// A required field has no default to leave it out for: its null says so.
	answer := func(b []byte) error { _, err := decodeToolAnswer(b); return err }
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		body   string
		field  string
	}{
		{"a work item's handler", work, `{"handler": null}`, "handler"},
		{"an answer's decision", answer, `{"tool_name": "x", "decision": null}`, "decision"},
		{"a tool call's tool_name", toolCall, `{"agent_id": "a", "tool_name": null}`, "tool_name"},
		{"a wake-up's work", wakeup, `{` + wake + `, "work": null}`, "work"},
		{"a wake-up work's handler", wakeup, `{` + wake + `, "work": {"handler": null}}`, "work.handler"},
		{"a spend's cost", spend, `{"agent_id": "a", "scope": "x", "cost": null}`, "cost"},
		{"a mandate's budget", mandate, `{"agent_id": "a", "scope": "x", "budget": null}`, "budget"},
	} {
		t.Run(tc.name+" (required) of null", func(t *testing.T) {
			var p *Problem
			require.ErrorAs(t, tc.decode([]byte(tc.body)), &p)
			require.Equal(t, http.StatusBadRequest, p.Status)
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: requiredNullDetail}}, p.Errors)
			require.Contains(t, p.Detail, tc.field)
		})
	}
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		body   string
	}{
		{"a work item's key and limit", work, `{"handler": "h", "concurrency_key": null, "key_limit": null}`},
		{"a wake-up's work key and limit", wakeup, `{` + wake + `, "work": {"handler": "h", "concurrency_key": null, "key_limit": null, "args": null}}`},
		{"args, any JSON", work, `{"handler": "h", "args": {"a": null, "b": [null]}}`},
		{"a mandate's valid_until", mandate, `{"agent_id": "a", "scope": "x", "budget": 1, "valid_until": null}`},
		{"a patch's valid_until (clear)", patch, `{"valid_until": null}`},
		{"a tool call's input", toolCall, `{"tool_name": "t", "input": null}`},
	} {
		t.Run(tc.name+" takes null", func(t *testing.T) {
			require.NoError(t, tc.decode([]byte(tc.body)))
		})
	}
}

// The request bodies' `required:"true"` tags are the document's required
// lists, nested objects included: a null for one is "is required", not
// "leave it out for its default".
func TestRequiredTagsMatchTheDocument(t *testing.T) {
	doc, err := contractDocument()
	require.NoError(t, err)
	bodies := map[string]reflect.Type{
		"setToolPolicy":          reflect.TypeFor[toolPolicyIn](),
		"putApprovalWebhook":     reflect.TypeFor[webhookIn](),
		"createMandate":          reflect.TypeFor[mandateCreateIn](),
		"spendMandate":           reflect.TypeFor[spendIn](),
		"updateMandate":          reflect.TypeFor[mandatePatchIn](),
		"updatePool":             reflect.TypeFor[poolPatch](),
		"enqueueWork":            reflect.TypeFor[workIn](),
		"appendStreamChunks":     reflect.TypeFor[streamAppendIn](),
		"answerToolCalls":        reflect.TypeFor[toolAnswerIn](),
		"requestToolCall":        reflect.TypeFor[toolCallIn](),
		"createWakeup":           reflect.TypeFor[wakeupRequest](),
		"approveMandateApproval": reflect.TypeFor[approvalResolveIn](),
		"denyMandateApproval":    reflect.TypeFor[approvalResolveIn](),
	}
	var check func(at string, s *openapi3.Schema, ty reflect.Type)
	check = func(at string, s *openapi3.Schema, ty reflect.Type) {
		for ty.Kind() == reflect.Pointer {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || s == nil {
			return
		}
		want := append([]string(nil), s.Required...)
		got := slices.Collect(maps.Keys(taggedFields(ty, "required", nil)))
		slices.Sort(want)
		slices.Sort(got)
		require.Equal(t, want, got, "%s: the fields tagged required", at)
		fields := jsonFields(ty, nil)
		for name, prop := range s.Properties {
			if ft, ok := fields[name]; ok && prop.Value != nil && len(prop.Value.Properties) > 0 {
				check(at+"."+name, prop.Value, ft)
			}
		}
	}
	seen := 0
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.RequestBody == nil || op.RequestBody.Value.Content.Get("application/json") == nil {
				continue
			}
			ty, ok := bodies[op.OperationID]
			require.True(t, ok, "%s: a JSON body this test does not know", op.OperationID)
			check(op.OperationID, op.RequestBody.Value.Content.Get("application/json").Schema.Value, ty)
			seen++
		}
	}
	require.Equal(t, len(bodies), seen)
}

// A work item's key_limit, run_at and timeout_ms, each checked before the
// service sees the item, are named together when several are wrong, with
// a missing handler the service would name too; each alone is named alone.
func TestAWorkItemsBadFieldsAreNamedTogether(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		fields     []string
	}{
		{"all three and no handler", `{"key_limit": 0, "run_at": "soon", "timeout_ms": 0}`, []string{"key_limit", "run_at", "timeout_ms", "handler"}},
		{"two of them", `{"handler": "h", "run_at": "soon", "timeout_ms": 0}`, []string{"run_at", "timeout_ms"}},
		{"key_limit alone", `{"handler": "h", "key_limit": 0}`, []string{"key_limit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeWorkEnqueue([]byte(tc.body))
			var p *Problem
			require.ErrorAs(t, err, &p)
			require.Equal(t, http.StatusBadRequest, p.Status)
			var got []string
			for _, f := range p.Errors {
				got = append(got, f.Field)
			}
			require.Equal(t, tc.fields, got)
		})
	}
}

// The document gives retry.base a minimum of 1 (default 2); the domain reads
// 0 as "the default", so an explicit 0 — or 1e-400, which decodes to 0 —
// was accepted and silently became 2, where 0.5 is a 400 (as key_limit and
// the work route's timeout_ms, guarded against exactly this).
func TestARetryBaseBelowOneIsRefused(t *testing.T) {
	s := newTestServer(t, withWorkpool(t))
	admin := subToken(t, "org-a", "root", "", RoleAdmin)
	before := workCount(t, s)
	for _, base := range []string{"0", "1e-400"} {
		body := `{"handler":"echo","retry":{"max_attempts":2,"base":` + base + `}}`
		do(t, s.Handler(), http.MethodPost, "/v1/pools/default/work", admin, body).
			requireProblem(t, http.StatusBadRequest, "retry.base")
	}
	require.Equal(t, before, workCount(t, s), "a refused request enqueues nothing")
}

// A null for a field the document lists as required says so ("is required;
// null is not a value", as the BadRequest response documents), not "leave
// the field out for its default": leaving these out is a 400 too.
// (TestRequiredTagsMatchTheDocument follows neither allOf nor array items,
// so retry.max_attempts and chunks[].data_base64 had gone untagged.)
func TestANullForARequiredNestedFieldSaysItIsRequired(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		decode      func() error
	}{
		{"retry.max_attempts", "retry.max_attempts", func() error {
			_, err := decodeWorkEnqueue([]byte(`{"handler":"h","retry":{"max_attempts":null}}`))
			return err
		}},
		{"work.retry.max_attempts", "work.retry.max_attempts", func() error {
			_, err := decodeWakeup([]byte(`{"agent_id":"a","workflow_id":"o/w","signal":"s","scope":"s","cost":1,"work":{"handler":"h","retry":{"max_attempts":null}}}`))
			return err
		}},
		{"chunks[0].data_base64", "chunks[0].data_base64", func() error {
			_, err := decodeStreamChunks([]byte(`{"chunks":[{"data_base64":null}]}`), 10)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p *Problem
			require.True(t, errors.As(tc.decode(), &p))
			require.Equal(t, []apperr.FieldError{{Field: tc.field, Detail: requiredNullDetail}}, p.Errors)
		})
	}
}
