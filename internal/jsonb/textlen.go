package jsonb

import (
	"bytes"
	"strconv"
	"strings"
)

// TextLen bounds how long b, valid JSON that Storable accepts, is as jsonb
// gives it back (less the space jsonb writes after ':' and ','): numbers
// in plain notation, as numeric prints them — 1e5000 is 5001 digits, from
// 6 bytes — and strings as sent (jsonb never prints a string longer than
// its escapes spelled it). A bound on what a client sends bounds what the
// database gives back only so measured: without it 1 KiB of 1e131071 was
// read back as 13 MB.
func TextLen(b []byte) int {
	n := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		case c == '"':
			end := stringEnd(b, i)
			n += end - i
			i = end - 1
		case c == '-' || c >= '0' && c <= '9':
			end := numberEnd(b, i)
			if !bytes.ContainsAny(b[i:end], "eE") {
				n += end - i // (without an exponent, printed as written)
			} else {
				n += numberTextLen(string(b[i:end]))
			}
			i = end - 1
		default:
			n++
		}
	}
	return n
}

// numberTextLen is the length of numeric_out's plain notation of the JSON
// number n (Storable's: its exponent in range). A zero written with an
// exponent or a sign counts a digit or the sign more than it prints:
// never less.
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
	out := sign + max(1, len(intPart)+exp-lead)
	if scale := max(0, len(fracPart)-exp); scale > 0 {
		out += 1 + scale
	}
	return out
}
