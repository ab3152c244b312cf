// Package jsonb tells which valid JSON Postgres jsonb refuses: the escape
// \u0000, UTF-16 surrogate escapes that do not pair up, and numbers out of
// numeric's range. The API checks request bodies with it (a 400 naming the
// field), the workpool handlers' results (a failed attempt instead of a
// statement that fails the whole report). Text makes any string storable
// as Postgres text; Equal compares two JSON texts as jsonb values.
package jsonb

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Text is s as Postgres text (and a jsonb string) can hold it: NUL and
// bytes that are not UTF-8 become U+FFFD. What a work target or a hook
// quotes may hold either, and one such value would fail the statement
// that writes it, again at every retry.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Postgres numeric's limits (numeric.c, Postgres 15): the exponent as
// written, then digits before the decimal point (NUMERIC_WEIGHT_MAX base-10⁴
// digits) and after it (NUMERIC_DSCALE_MAX). api's
// TestStorableJSONAgreesWithPostgres checks them at their edges.
const (
	maxNumericExponent   = math.MaxInt32 / 2 // exclusive
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// Storable reports whether Postgres jsonb accepts b, which must be valid
// JSON (json.Valid, which takes strings that are not UTF-8): one pass over
// its lexemes.
func Storable(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			end := stringEnd(b, i)
			if _, ok := StringProblem(b[i:end]); !ok {
				return false
			}
			i = end - 1
		case c == '-' || c >= '0' && c <= '9':
			end := numberEnd(b, i)
			if _, ok := NumberProblem(b[i:end]); !ok {
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

// StringProblem checks a string lexeme's bytes and \u escapes: why jsonb
// refuses it, or true.
func StringProblem(s []byte) (string, bool) {
	if !utf8.Valid(s) {
		return "must be UTF-8 text", false
	}
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

// NumberProblem checks a JSON number lexeme against Postgres numeric: why
// jsonb refuses it, or true.
func NumberProblem(n []byte) (string, bool) {
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

// Nesting is how deep the arrays and objects of b, valid JSON, nest (0 for
// a scalar). Go's decoder refuses JSON nested past 10,000, so a value shown
// again inside others must leave them room.
func Nesting(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}
