package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAuthReloadSIGHUP: `lockd serve` reads its auth file again on SIGHUP
// (docs/security.md, *Reloading the auth file*): a token removed from the
// file is refused without a restart, and a file that does not parse keeps
// the rules in force and is logged.
func TestAuthReloadSIGHUP(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	lines := map[string]string{}
	for _, tok := range [][]string{{"ops.token", "admin", "ops"}, {"billing.token", "lock:billing/", "billing-app"}} {
		out, errOut, code := lockdCLI(t, "", "token", "--out", file(tok[0]), "--grant", tok[1], tok[2])
		if code != 0 {
			t.Fatalf("lockd token %v: exit %d: %s", tok, code, errOut)
		}
		lines[tok[2]] = out
	}
	replace := func(content string) {
		t.Helper()
		if err := os.WriteFile(file("auth.new"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file("auth.new"), file("auth.txt")); err != nil {
			t.Fatal(err)
		}
	}
	replace(lines["ops"] + lines["billing-app"])
	srv := startNode(t, file("data"), freePort(t), freePort(t), "/readyz", "--auth-file", file("auth.txt"))
	describe := func(token string) (string, int) {
		_, errOut, code := lockdCLI(t, srv.url, "describe", "--token-file", file(token), "billing/x")
		return errOut, code
	}
	if errOut, code := describe("billing.token"); code != 0 {
		t.Fatalf("billing describes billing/x: exit %d: %s", code, errOut)
	}
	logHas := func(s string) func() bool {
		return func() bool {
			b, _ := os.ReadFile(srv.log)
			return strings.Contains(string(b), s)
		}
	}

	replace(lines["ops"])
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !pollEvery(10*time.Second, 20*time.Millisecond, logHas(`msg="auth file reloaded" component=auth why="reload requested"`)) {
		t.Fatal("no reload logged after SIGHUP")
	}
	if errOut, code := describe("billing.token"); code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Errorf("removed token after SIGHUP: exit %d: %s", code, errOut)
	}

	replace(lines["ops"] + "grant ops everything\n")
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !pollEvery(10*time.Second, 20*time.Millisecond, logHas("sighup: auth file not reloaded")) {
		t.Fatal("no error logged for a broken file after SIGHUP")
	}
	if errOut, code := describe("ops.token"); code != 0 {
		t.Errorf("ops after a broken file: exit %d: %s", code, errOut)
	}
	if errOut, code := describe("billing.token"); code == 0 {
		t.Errorf("removed token after a broken file: exit 0: %s", errOut)
	}
	if got := scrapeMetric(t, srv.url, `lockd_auth_reloads_total{outcome="error"}`); got < 1 {
		t.Errorf(`lockd_auth_reloads_total{outcome="error"} = %v, want >= 1`, got)
	}
}
