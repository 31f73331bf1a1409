// Package label holds the one rule for the strings lockd stores for people
// to read: lock names and session owner labels. Both are shown in terminals
// (lockd describe, sessions, top, watch) and the dashboard, so neither may
// carry a control character a terminal would obey.
package label

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Check reports why s, the what of a request ("lock name", "owner"),
// cannot be stored, or nil: it must be valid UTF-8 without control
// characters (C0, DEL and C1, as unicode.IsControl reports them).
func Check(what, s string) error {
	if !utf8.ValidString(s) {
		return errors.New(what + " is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s contains control character %U", what, r)
		}
	}
	return nil
}
