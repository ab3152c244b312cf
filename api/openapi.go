package api

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"iter"
	"path"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// The OpenAPI document is written in parts, one per domain
// (openapi/<domain>.yaml), merged at start: each part holds `paths` and
// `components`; 00-base.yaml holds the rest.
//
//go:embed openapi/*.yaml
var openapiParts embed.FS

// OpenAPIDocument returns the merged OpenAPI 3 document as JSON.
func OpenAPIDocument() ([]byte, error) {
	doc, err := mergedOpenAPI()
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

func mergedOpenAPI() (map[string]any, error) {
	names, err := fs.Glob(openapiParts, "openapi/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	doc := map[string]any{}
	for _, name := range names {
		raw, err := fs.ReadFile(openapiParts, name)
		if err != nil {
			return nil, err
		}
		var part map[string]any
		if err := yaml.Unmarshal(raw, &part); err != nil {
			return nil, fmt.Errorf("openapi part %s: %w", path.Base(name), err)
		}
		if err := mergeInto(doc, part, path.Base(name)); err != nil {
			return nil, err
		}
	}
	declareServerFailures(doc)
	declareReplayHeader(doc)
	return doc, nil
}

// declareReplayHeader declares Idempotent-Replayed on the 2xx answers of
// every operation that takes an Idempotency-Key, the answers a retry is
// replayed most (the shared error responses are $refs, which cannot take
// a header beside them; the key's description names it for those).
func declareReplayHeader(doc map[string]any) {
	for o := range operations(doc) {
		if !takesIdempotencyKey(o.op) {
			continue
		}
		responses, _ := o.op["responses"].(map[string]any)
		for status, r := range responses {
			res, _ := r.(map[string]any)
			if res == nil || !strings.HasPrefix(status, "2") || res["$ref"] != nil {
				continue
			}
			headers, _ := res["headers"].(map[string]any)
			if headers == nil {
				headers = map[string]any{}
				res["headers"] = headers
			}
			headers["Idempotent-Replayed"] = map[string]any{"$ref": "#/components/headers/IdempotentReplayed"}
		}
	}
}

// takesIdempotencyKey reports whether op lists the IdempotencyKey parameter.
func takesIdempotencyKey(op map[string]any) bool {
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		if m, _ := p.(map[string]any); m != nil && m["$ref"] == "#/components/parameters/IdempotencyKey" {
			return true
		}
	}
	return false
}

// declareServerFailures declares, on every operation that does not declare
// its own, the two answers any handler may give whatever its route (see
// problemFor): 500 `internal`, and 503 `unavailable` while the database
// cannot be reached — except on the operations marked
// `x-reveille-database: false`, which touch none. Written once here, not
// in each part, so that no new operation can leave them out: a generated
// client then knows a 503 as retryable, and the test server's contract
// check admits them where they happen.
func declareServerFailures(doc map[string]any) {
	for o := range operations(doc) {
		responses, _ := o.op["responses"].(map[string]any)
		if responses == nil {
			continue
		}
		if _, ok := responses["500"]; !ok {
			responses["500"] = map[string]any{"$ref": "#/components/responses/Internal"}
		}
		if _, ok := responses["503"]; !ok && o.op["x-reveille-database"] != false {
			responses["503"] = map[string]any{"$ref": "#/components/responses/Unavailable"}
		}
	}
}

// bodylessOperations lists the document's operations that take no request
// body, as "METHOD /echo/:pattern".
func bodylessOperations() (map[string]bool, error) {
	doc, err := mergedOpenAPI()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for o := range operations(doc) {
		if _, body := o.op["requestBody"]; !body {
			out[strings.ToUpper(o.method)+" "+openapiParam.ReplaceAllString(o.path, ":$1")] = true
		}
	}
	return out, nil
}

// operation is one operation of the document: its method (lower case),
// its path as the document spells it, and the operation object.
type operation struct {
	method, path string
	op           map[string]any
}

// operations yields each operation of doc.
func operations(doc map[string]any) iter.Seq[operation] {
	return func(yield func(operation) bool) {
		paths, _ := doc["paths"].(map[string]any)
		for path, item := range paths {
			ops, _ := item.(map[string]any)
			for _, method := range httpMethods {
				if op, ok := ops[method].(map[string]any); ok && !yield(operation{method, path, op}) {
					return
				}
			}
		}
	}
}

// httpMethods are the operations' keys in a path item.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// openapiParam is a path parameter as the document spells it: {name}.
var openapiParam = regexp.MustCompile(`\{([^}]+)\}`)

// mergeInto merges src into dst: maps merge recursively; any other value
// defined twice is an error, except under paths where methods merge.
func mergeInto(dst, src map[string]any, where string) error {
	for k, v := range src {
		existing, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		em, ok1 := existing.(map[string]any)
		vm, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("openapi part %s redefines %q", where, k)
		}
		if err := mergeInto(em, vm, where+": "+k); err != nil {
			return err
		}
	}
	return nil
}
