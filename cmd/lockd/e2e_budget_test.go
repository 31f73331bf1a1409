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

// TestRunLockSet: `lockd run --lock b --lock a -- CMD` takes both locks at
// once and gives CMD every token (LOCKD_TOKENS, in --lock order); with one
// of them held elsewhere, `--no-wait` is refused (exit 75) holding
// neither.
func TestRunLockSet(t *testing.T) {
	srv := startServer(t)
	out, errOut, code := lockdCLI(t, srv.url, "run", "--lock", "set/b", "--lock", "set/a", "--", "sh", "-c", `echo "$LOCKD_TOKENS|$LOCKD_LOCK"`)
	if code != 0 {
		t.Fatalf("run: exit %d: %s %s", code, out, errOut)
	}
	line := strings.TrimSpace(out)
	toks, lock, _ := strings.Cut(line, "|")
	parts := strings.Split(toks, ",")
	if len(parts) != 2 || !strings.HasPrefix(parts[0], "set/b=") || !strings.HasPrefix(parts[1], "set/a=") || parts[0][len("set/b="):] == parts[1][len("set/a="):] || lock != "set/b,set/a" {
		t.Fatalf("command saw %q", line)
	}
	holder := startLockd(t, srv.url, "run", "set/a", "--", "sleep", "600")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		o, _, c := lockdCLI(t, srv.url, "describe", "--json", "set/a")
		return c == 0 && strings.Contains(o, `"holders"`)
	}) {
		t.Fatalf("set/a not held; holder printed %q", holder.lines())
	}
	out, errOut, code = lockdCLI(t, srv.url, "run", "--no-wait", "--lock", "set/a", "--lock", "set/c", "--", "true")
	if code != exitConflict {
		t.Fatalf("run with set/a held: exit %d (want %d): %s %s", code, exitConflict, out, errOut)
	}
	if o, _, _ := lockdCLI(t, srv.url, "describe", "--json", "set/c"); strings.Contains(o, `"holders"`) {
		t.Fatalf("set/c held after a refused set: %s", o)
	}
	if _, errOut, code := lockdCLI(t, srv.url, "run", "--lock", "set/a", "--", "true"); code != exitUsage || !strings.Contains(errOut, "2 to 32") {
		t.Fatalf("one --lock: exit %d: %s", code, errOut)
	}
}
