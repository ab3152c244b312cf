package jsonb

import (
	"bytes"
	"strconv"
	"strings"
)

// TextLen bounds how long b, valid JSON that Storable accepts, is as jsonb
// gives it back: numbers in plain notation, as numeric prints them —
// 1e5000 is 5001 digits, from 6 bytes — a space after every ',' and ':',
// and strings as sent (jsonb never prints a string longer than its escapes
// spelled it). A bound on what a client sends bounds what the database
// gives back only so measured: without it 1 KiB of 1e131071 was read back
// as 13 MB.
func TextLen(b []byte) int {
	n := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		case c == ',' || c == ':':
			n += 2
		case c == '"':
			end := stringEnd(b, i)
			n += end - i
			i = end - 1
		case c == '-' || c >= '0' && c <= '9':
			end := numberEnd(b, i)
			n += numberLen(b[i:end])
			i = end - 1
		default:
			n++
		}
	}
	return n
}

// MaxNumberGrowth bounds how much longer than written the numbers of a
// JSON value the service stores may print (NumberGrowth): room for a few
// hundred floats such as 1e300 (301 digits each), none for 1 KiB of
// 1e131071 coming back as 13 MB at every read. Past it a request body is
// refused (400), a target's body kept as a string, a handler's result
// failed.
const MaxNumberGrowth = 64 << 10

// NumberGrowth is how much longer b's numbers (b valid JSON that Storable
// accepts) are as jsonb prints them, in plain notation, than as written.
func NumberGrowth(b []byte) int {
	n := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			i = stringEnd(b, i) - 1
		case c == '-' || c >= '0' && c <= '9':
			end := numberEnd(b, i)
			n += max(0, numberLen(b[i:end])-(end-i))
			i = end - 1
		}
	}
	return n
}

// numberLen is numberTextLen, without its work for a number written
// without an exponent: printed as written.
func numberLen(lexeme []byte) int {
	if !bytes.ContainsAny(lexeme, "eE") {
		return len(lexeme)
	}
	return numberTextLen(string(lexeme))
}

// numberTextLen is the length of numeric_out's plain notation of the JSON
// number n (Storable's: its exponent in range). A zero written with a
// sign counts the sign, which it does not print: never less.
func numberTextLen(n string) int {
	sign := 0
	if strings.HasPrefix(n, "-") {
		sign, n = 1, n[1:]
	}
	mantissa, exponent, _ := strings.Cut(strings.ToLower(n), "e")
	intPart, fracPart, _ := strings.Cut(mantissa, ".")
	exp := 0
	if exponent != "" {
		e, err := strconv.Atoi(exponent)
		if err != nil {
			return len(n) + sign
		}
		exp = e
	}
	digits := intPart + fracPart
	lead := len(digits) - len(strings.TrimLeft(digits, "0"))
	intDigits := len(intPart) + exp - lead
	if lead == len(digits) {
		intDigits = 1 // zero prints "0" whatever its exponent
	}
	out := sign + max(1, intDigits)
	if scale := max(0, len(fracPart)-exp); scale > 0 {
		out += 1 + scale
	}
	return out
}
