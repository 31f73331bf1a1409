package designdoc

import (
	"os/exec"
	"strings"
	"testing"
)

// CheckNoDeps fails t when the package in dir depends, directly or not, on
// a package whose import path ends in one of banned (for example
// "/internal/server") or lies under it, as `go list -deps` reports. It
// skips without a go command on PATH.
func CheckNoDeps(t testing.TB, dir string, banned ...string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	cmd := exec.Command(goBin, "list", "-deps", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	for _, d := range deps {
		for _, b := range banned {
			if strings.HasSuffix(d, b) || strings.Contains(d, b+"/") {
				t.Errorf("the package depends on %s", d)
			}
		}
	}
}
