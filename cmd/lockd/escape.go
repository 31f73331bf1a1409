package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s as the CLI prints a string that came from the server
// (an owner label, a lock name, a session or node id, an address, an error
// message): printable UTF-8 unchanged, and every control character (C0,
// DEL, C1: what unicode.IsControl reports, the rule lock names and owners
// are held to) and every byte of invalid UTF-8 as a Go escape (\x1b, \n,
// \u009b, \xff). The server refuses control characters in new names and
// owners, but a state restored from an older node's snapshot may hold
// them, and a terminal obeys them: one owner could clear, retitle or
// recolour an admin's screen or plant a hyperlink (the class of kubectl's
// CVE-2021-25743). Every table and plain-text line of the CLI goes through
// here; --json output is escaped by JSON itself.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u009b'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// escapeJSON returns JSON b with every DEL and C1 character written as a
// \u escape. Go's JSON encoders (encoding/json, protojson) escape C0
// controls but leave DEL and C1 raw, and a terminal may obey a raw C1 CSI
// (U+009B). Outside strings valid JSON holds no such character, so the
// document decodes to the same values.
func escapeJSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, rawInJSON) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if rawInJSON(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// rawInJSON reports a control character Go's JSON encoders leave raw.
func rawInJSON(r rune) bool { return r == 0x7f || (r >= 0x80 && r <= 0x9f) }
