package jsonb

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// Equal says whether two JSON texts hold the same value as jsonb compares
// them: objects by their members whatever the order, numbers by their
// exact value (1, 1.0 and 1e0 are one value; 9007199254740993 is not
// 9007199254740992, as it would be decoded to float64), text "null" and
// an empty text alike. A text that is not one JSON value equals nothing.
// It compares a request with what a table kept of an earlier one, which
// jsonb wrote back in its own spelling.
func Equal(a, b []byte) bool {
	x, okA := decodeValue(a)
	y, okB := decodeValue(b)
	return okA && okB && sameValue(x, y)
}

func decodeValue(b []byte) (any, bool) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if len(bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")) != 0 {
		return nil, false // more after the value
	}
	return v, true
}

func sameValue(x, y any) bool {
	switch x := x.(type) {
	case map[string]any:
		y, ok := y.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !sameValue(xv, yv) {
				return false
			}
		}
		return true
	case []any:
		y, ok := y.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := y.(json.Number)
		return ok && (x == y || canonicalNumber(string(x)) == canonicalNumber(string(y)))
	default: // string, bool, nil
		return x == y
	}
}

// canonicalNumber spells a JSON number as sign, significant digits and
// exponent, so that two spellings of one value are one string (an
// exponent too long to read spells the number as written).
func canonicalNumber(n string) string {
	sign := ""
	if strings.HasPrefix(n, "-") {
		sign, n = "-", n[1:]
	}
	mantissa, exp := n, 0
	if i := strings.IndexAny(n, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(n[i+1:], "+"))
		if err != nil {
			return sign + n
		}
		mantissa, exp = n[:i], e
	}
	digits := mantissa
	if i := strings.IndexByte(mantissa, '.'); i >= 0 {
		digits = mantissa[:i] + mantissa[i+1:]
		exp -= len(mantissa) - i - 1
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0" // -0 is 0
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	return sign + trimmed + "e" + strconv.Itoa(exp)
}
