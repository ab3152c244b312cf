package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/reveille/reveille/internal/jsonb"
)

// Postgres stores request bodies' strings as text and raw JSON fields
// (args) as jsonb, and rejects some valid JSON: the escape \u0000, UTF-16
// surrogate escapes that do not pair up, and numbers out of numeric's
// range. Caught here, they are a 400 naming the field instead of a failed
// statement (a 500).

// unstorableJSON names the first key or value of body (valid JSON) that
// Postgres cannot store, by its path ("work.args.k", "chunks[2]"), with
// why. It reads the body once; only a body that holds such a value is
// walked again to name it.
func unstorableJSON(body []byte) (field, detail string, found bool) {
	if jsonb.Storable(body) {
		return "", "", false
	}
	return unstorablePath(body)
}

// unstorablePath walks body token by token, keeping the path, until it
// meets the value jsonb.Storable refused.
func unstorablePath(body []byte) (field, detail string, found bool) {
	type frame struct {
		object    bool
		key       string
		index     int
		expectKey bool
	}
	var stack []frame
	path := func() string {
		var sb strings.Builder
		for _, f := range stack {
			if f.object {
				if sb.Len() > 0 {
					sb.WriteByte('.')
				}
				sb.WriteString(f.key)
			} else {
				sb.WriteString("[" + strconv.Itoa(f.index) + "]")
			}
		}
		return cmp.Or(sb.String(), "body")
	}
	valueDone := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].object {
				stack[n-1].expectKey = true
			} else {
				stack[n-1].index++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		raw := bytes.TrimLeft(body[start:dec.InputOffset()], " \t\r\n,:")
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				stack = append(stack, frame{object: tok == '{', expectKey: tok == '{'})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].expectKey {
				stack[n-1].key, stack[n-1].expectKey = tok, false
				if d, ok := jsonb.StringProblem(raw); !ok {
					return path(), d, true // the key names itself
				}
				continue
			}
			if d, ok := jsonb.StringProblem(raw); !ok {
				return path(), d, true
			}
			valueDone()
		case json.Number:
			if d, ok := jsonb.NumberProblem(raw); !ok {
				return path(), d, true
			}
			valueDone()
		default:
			valueDone()
		}
	}
}
