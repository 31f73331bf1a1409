package sectionlog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	f := Format{Begin: "start", End: "end", Fields: 3, Token: 1}
	for _, tc := range []struct {
		name, log string
		want      int
		bad       string // substring of the error, "" for none
	}{
		{"ok", "start 1 a\nend 1 a\nstart 5 b\nend 5 b\n", 2, ""},
		{"overlap", "start 1 a\nstart 2 b\nend 2 b\nend 1 a\n", 0, "overlapping"},
		{"token back", "start 5 a\nend 5 a\nstart 4 b\nend 4 b\n", 1, "strictly increasing"},
		{"token repeated", "start 5 a\nend 5 a\nstart 5 b\nend 5 b\n", 1, "strictly increasing"},
		{"foreign end", "start 1 a\nend 1 b\n", 0, "while"},
		{"never ended", "start 1 a\n", 0, "never ended"},
		{"malformed", "start 1\n", 0, "malformed"},
	} {
		path := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(path, []byte(tc.log), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := Check(path, f)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.bad)
		case got != tc.want:
			t.Errorf("%s: got %d sections, want %d", tc.name, got, tc.want)
		}
	}
}
