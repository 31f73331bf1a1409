package guard

import "testing"

// TestNormalizeHost: the forms a Host header or a flag value takes.
func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM:7070": "example.com", "example.com.": "example.com", "[::1]:7070": "::1",
		"[::1]": "::1", "::1": "::1", "127.0.0.1": "127.0.0.1", "": "", "*.Corp.Example": "*.corp.example",
	} {
		if got := normalizeHost(in); got != want {
			t.Errorf("normalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}
