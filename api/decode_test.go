package api

import (
	"errors"
	"net/http"
	"testing"

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
	for _, ok := range []string{
		`{"pool": "p", "work": {"args": {"anything": {"goes": 1}}}}`,
		`{"POOL": "p", "Work": {"HANDLER": "h"}}`,
	} {
		var dst body
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
