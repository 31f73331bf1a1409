package main

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunMaxHoldOnServer: `lockd run --max-hold 4s` (a second or more) is
// also the hold's budget on the server. With that lockd run process
// SIGSTOPped (its session's 60 s lease still running, the command stuck),
// another `lockd run` is granted the lock after about the budget, long
// before the lease could expire; `lockd describe` showed the budget's
// holder before. The bound asserted is the lease, not the budget: a
// correctness check, not a timing one.
func TestRunMaxHoldOnServer(t *testing.T) {
	srv := startServer(t)
	holder := startLockd(t, srv.url, "run", "--ttl", "60s", "--max-hold", "4s", "--kill-grace", "200ms", "budget/job", "--", "sleep", "600")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		out, _, code := lockdCLI(t, srv.url, "describe", "--json", "budget/job")
		return code == 0 && strings.Contains(out, `"maxHold": "4s"`)
	}) {
		out, _, _ := lockdCLI(t, srv.url, "describe", "--json", "budget/job")
		t.Fatalf("no holder with a 4s budget: %s; holder printed %q", out, holder.lines())
	}
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer holder.cmd.Process.Signal(syscall.SIGCONT)
	start := time.Now()
	out, errOut, code := lockdCLI(t, srv.url, "run", "--wait", "50s", "budget/job", "--", "true")
	if code != 0 {
		t.Fatalf("second run: exit %d: %s %s", code, out, errOut)
	}
	took := time.Since(start)
	if took >= 50*time.Second {
		t.Fatalf("granted after %v: the budget did not end the stopped holder's hold", took)
	}
	// Unstopped, the holder's lockd run stops its command before the
	// budget runs out and says so.
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	<-holder.done
	if out := strings.Join(holder.lines(), "\n"); !strings.Contains(out, "max-hold") {
		t.Errorf("holder printed %q, want the budget named", out)
	}
	t.Logf("granted %v after the holder stopped (budget 4s, lease 60s)", took)
}
