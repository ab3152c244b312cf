package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// Postgres stores request bodies' strings as text and raw JSON fields
// (args) as jsonb, and rejects some valid JSON: the escape \u0000, UTF-16
// surrogate escapes that do not pair up, and numbers out of numeric's
// range. Caught here, they are a 400 naming the field instead of a failed
// statement (a 500).

// Postgres numeric's limits (numeric.c, Postgres 15): the exponent as
// written, then digits before the decimal point (NUMERIC_WEIGHT_MAX base-10⁴
// digits) and after it (NUMERIC_DSCALE_MAX), TestStorableJSONAgreesWithPostgres
// checks them at their edges.
const (
	maxNumericExponent   = math.MaxInt32 / 2 // exclusive
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// unstorableJSON names the first key or value of body (valid JSON) that
// Postgres cannot store, by its path ("work.args.k", "chunks[2]"), with
// why. It reads the body once; only a body that holds such a value is
// walked again to name it.
func unstorableJSON(body []byte) (field, detail string, found bool) {
	if storableJSON(body) {
		return "", "", false
	}
	return unstorablePath(body)
}

// storableJSON is one pass over the lexemes of valid JSON.
func storableJSON(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			end := stringEnd(b, i)
			if _, ok := stringLexemeProblem(b[i:end]); !ok {
				return false
			}
			i = end - 1
		case c == '-' || c >= '0' && c <= '9':
			end := numberEnd(b, i)
			if _, ok := numberLexemeProblem(b[i:end]); !ok {
				return false
			}
			i = end - 1
		}
	}
	return true
}

// stringEnd returns the index just past the string lexeme starting at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		k := bytes.IndexAny(b[j:], `"\`)
		if k < 0 {
			break
		}
		j += k
		if b[j] == '"' {
			return j + 1
		}
		j++ // the escaped character
	}
	return len(b)
}

func numberEnd(b []byte, i int) int {
	j := i
	for j < len(b) && strings.IndexByte("0123456789.eE+-", b[j]) >= 0 {
		j++
	}
	return j
}

// stringLexemeProblem checks a string lexeme's \u escapes.
func stringLexemeProblem(s []byte) (string, bool) {
	if bytes.IndexByte(s, '\\') < 0 {
		return "", true
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		v, ok := hex4(s, i+1)
		i += 4
		switch {
		case !ok:
			return "must be a valid JSON string", false
		case v == 0:
			return `must not hold a NUL character (\u0000)`, false
		case v >= 0xDC00 && v <= 0xDFFF:
			return "must not hold an unpaired UTF-16 surrogate escape", false
		case v >= 0xD800 && v <= 0xDBFF:
			low, ok := -1, i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u'
			if ok {
				low, ok = hex4(s, i+3)
			}
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return "must not hold an unpaired UTF-16 surrogate escape", false
			}
			i += 6
		}
	}
	return "", true
}

func hex4(s []byte, at int) (int, bool) {
	if at+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s[at:at+4]), 16, 16)
	return int(v), err == nil
}

// numberLexemeProblem checks a JSON number against Postgres numeric.
func numberLexemeProblem(n []byte) (string, bool) {
	const tooLarge = "must be a number Postgres can store (at most 131072 digits before the decimal point and 16383 after)"
	mantissa, exponent, _ := strings.Cut(strings.ToLower(string(n)), "e")
	intPart, fracPart, _ := strings.Cut(strings.TrimPrefix(mantissa, "-"), ".")
	exp := 0
	if exponent != "" {
		e, err := strconv.Atoi(exponent)
		if err != nil || e >= maxNumericExponent || e <= -maxNumericExponent {
			return tooLarge, false
		}
		exp = e
	}
	if len(fracPart)-exp > maxNumericFracDigits {
		return tooLarge, false
	}
	// Zero has no digits before the point, however large its exponent.
	digits := intPart + fracPart
	if first := strings.IndexFunc(digits, func(r rune) bool { return r != '0' }); first >= 0 && len(intPart)-first+exp > maxNumericIntDigits {
		return tooLarge, false
	}
	return "", true
}

// unstorablePath walks body token by token, keeping the path, until it
// meets the value storableJSON refused.
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
				if d, ok := stringLexemeProblem(raw); !ok {
					return path(), d, true // the key names itself
				}
				continue
			}
			if d, ok := stringLexemeProblem(raw); !ok {
				return path(), d, true
			}
			valueDone()
		case json.Number:
			if d, ok := numberLexemeProblem(raw); !ok {
				return path(), d, true
			}
			valueDone()
		default:
			valueDone()
		}
	}
}
