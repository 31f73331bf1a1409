package guard

import (
	"strings"
	"testing"
)

// TestNewRefusesMissingDeps: a Deps without one of the functions or
// values the guard calls is an error from New that names it, not a guard
// that panics later, at its first refusal (APIError, StreamError, State)
// or inside New (Log, Registerer, the counters).
func TestNewRefusesMissingDeps(t *testing.T) {
	for _, tc := range []struct {
		field string
		clear func(*Deps)
	}{
		{"Log", func(d *Deps) { d.Log = nil }},
		{"State", func(d *Deps) { d.State = nil }},
		{"APIError", func(d *Deps) { d.APIError = nil }},
		{"StreamError", func(d *Deps) { d.StreamError = nil }},
		{"LimitHits", func(d *Deps) { d.LimitHits = nil }},
		{"AuthReloads", func(d *Deps) { d.AuthReloads = nil }},
		{"Registerer", func(d *Deps) { d.Registerer = nil }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			d := testDeps()
			tc.clear(&d)
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("New panicked without Deps.%s: %v", tc.field, r)
					}
				}()
				_, err = New(Config{}, d)
			}()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("New without Deps.%s: err %v, want an error naming it", tc.field, err)
			}
		})
	}
	// The optional ones: no TLS store and no TLS identity (plaintext).
	d := testDeps()
	d.TLS, d.TLSIdentity, d.NodeID = nil, nil, ""
	if _, err := New(Config{}, d); err != nil {
		t.Fatalf("New without the optional Deps: %v", err)
	}
}
