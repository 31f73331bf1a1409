package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The release binary links no fault-injection code: internal/diskfault is
// among lockd's dependencies only in a build with the tag lockdfault (the
// chaos tool's). The tagged build is listed too, so that the check fails
// if the package is ever renamed away from what it looks for.
func TestReleaseLinksNoFaultHooks(t *testing.T) {
	deps := func(tags ...string) string {
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			t.Skipf("go list: %v\n%s", err, out)
		}
		return string(out)
	}
	const hook = "github.com/lockd-dev/lockd/internal/diskfault\n"
	if strings.Contains(deps(), hook) {
		t.Error("go list -deps ./cmd/lockd includes internal/diskfault: a fault hook is linked into the release binary")
	}
	if !strings.Contains(deps("-tags", "lockdfault"), hook) {
		t.Error("go list -deps -tags lockdfault ./cmd/lockd lacks internal/diskfault: the chaos build has no disk hook")
	}
}
