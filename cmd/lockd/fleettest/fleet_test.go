package fleettest

// `lockd cron '* * * * *' job -- …` on four
// processes for three minutes, one with its scheduler clock 8 s ahead (the
// LOCKD_TEST_CLOCK_OFFSET hook), one killed with SIGKILL while it runs the
// job, and restarted: the job completes exactly
// once per minute, and the first attempt of every minute, which exits 1,
// is retried by another process in the same minute.

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/proctest"
)

// fleetDuration is how long the fleet runs.
const fleetDuration = 3 * time.Minute

// job fails the first attempt of each period (mkdir is atomic), and
// otherwise logs "start", works 2 s and logs "ok" as its last act, so a
// run killed midway leaves no "ok".
const job = `p=${LOCKD_LOCK#job@}
if mkdir "$DIR/fail-$p" 2>/dev/null; then echo "$p fail $ID $(date +%s)" >> "$DIR/log"; exit 1; fi
echo "$p start $ID $(date +%s)" >> "$DIR/log"
sleep 2
echo "$p ok $ID $(date +%s)" >> "$DIR/log"
`

func needBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lockd")
	out, err := exec.Command("go", "build", "-tags", "lockdfault", "-o", bin, "github.com/lockd-dev/lockd/cmd/lockd").CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go build ./cmd/lockd: %v\n%s", err, out)
		}
		t.Skipf("lockd binary not built: %v\n%s", err, out)
	}
	return bin
}

// freePort returns a 127.0.0.1 address free now (proctest.FreePort).
func freePort(t *testing.T) string { return proctest.FreePort(t) }

// proc is a process the test started; it is killed at cleanup.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func start(t *testing.T, name, logFile string, env []string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &proc{cmd: exec.Command(name, args...), log: logFile, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// poll calls cond every 50 ms until it holds or timeout passes.
func poll(timeout time.Duration, cond func() bool) bool {
	end := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // polling real processes, with a deadline
	}
	return true
}

type line struct {
	period time.Time
	what   string // fail, start, ok
	id     string
	at     time.Time
}

func (l line) String() string {
	return fmt.Sprintf("%s by %s at %s", l.what, l.id, l.at.UTC().Format("15:04:05"))
}

func readLog(t *testing.T, file string) []line {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []line
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		p, err := time.Parse(time.RFC3339, f[0])
		if err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		sec, _ := strconv.ParseInt(f[3], 10, 64)
		out = append(out, line{p, f[1], f[2], time.Unix(sec, 0)})
	}
	return out
}

func TestCronFleet(t *testing.T) {
	t.Parallel()
	bin := needBinary(t)
	dir := t.TempDir()
	api := freePort(t)
	start(t, bin, filepath.Join(dir, "server.log"), nil, "serve",
		"--data-dir", filepath.Join(dir, "data"), "--listen", api, "--raft-listen", freePort(t),
		"--heartbeat-timeout", "100ms", "--election-timeout", "100ms", "--grace", "100ms")
	hc := &http.Client{Timeout: time.Second}
	if !poll(15*time.Second, func() bool {
		resp, err := hc.Get("http://" + api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		t.Fatalf("lockd serve not ready after 15s:\n%s", b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"log", "cron-0.log", "cron-1.log", "cron-2.log", "cron-3.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, f))
				t.Logf("%s:\n%s", f, b)
			}
		}
	})

	// Retry delay 15 s: longer than process 0's 8 s lead, so its own retry
	// of a period comes after the others have queued for the lock.
	cron := func(id int, offset string) *proc {
		env := []string{"LOCKD_ENDPOINTS=http://" + api, "DIR=" + dir, "ID=" + strconv.Itoa(id)}
		if offset != "" {
			env = append(env, "LOCKD_TEST_CLOCK_OFFSET="+offset)
		}
		return start(t, bin, filepath.Join(dir, fmt.Sprintf("cron-%d.log", id)), env,
			"cron", "--ttl", "3s", "--retry-delay", "15s", "* * * * *", "job", "--", "sh", "-c", job)
	}
	began := time.Now()
	procs := []*proc{cron(0, "8s"), cron(1, ""), cron(2, ""), cron(3, "")}

	// After 70 s, kill with SIGKILL the process that runs the job at that
	// moment (the first "start" within 65 s, which holds a minute boundary; process 1 if none), and
	// restart it 20 s later.
	time.Sleep(70 * time.Second) // let the fleet run
	victim := 1
	killedMidJob := poll(65*time.Second, func() bool {
		ls := readLog(t, filepath.Join(dir, "log"))
		if len(ls) == 0 || ls[len(ls)-1].what != "start" {
			return false
		}
		victim, _ = strconv.Atoi(ls[len(ls)-1].id)
		return true
	})
	_ = procs[victim].cmd.Process.Kill()
	<-procs[victim].done
	t.Logf("process %d killed at %v (mid-job: %v)", victim, time.Since(began).Round(time.Second), killedMidJob)
	time.Sleep(20 * time.Second) // the victim stays down
	offset := ""
	if victim == 0 {
		offset = "8s"
	}
	procs[victim] = cron(victim, offset)

	time.Sleep(time.Until(began.Add(fleetDuration)))
	ended := time.Now()
	for i, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			if p.err != nil {
				t.Errorf("process %d: after SIGTERM: %v, want exit 0", i, p.err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("process %d still running 15 s after SIGTERM", i)
		}
	}

	byPeriod := map[int64][]line{} // by the period's Unix time
	for _, l := range readLog(t, filepath.Join(dir, "log")) {
		byPeriod[l.period.Unix()] = append(byPeriod[l.period.Unix()], l)
	}
	var full []time.Time // periods wholly inside the run (for every clock)
	for p := began.Truncate(time.Minute).Add(time.Minute); !p.Add(time.Minute).After(ended); p = p.Add(time.Minute) {
		full = append(full, p)
	}
	if len(full) < 2 {
		t.Fatalf("only %d full periods in the run", len(full))
	}
	var keys []int64
	for p := range byPeriod {
		keys = append(keys, p)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, p := range keys {
		var oks []line
		for _, l := range byPeriod[p] {
			if l.what == "ok" {
				oks = append(oks, l)
			}
		}
		t.Logf("period %s: %v", time.Unix(p, 0).UTC().Format(time.RFC3339), byPeriod[p])
		if len(oks) > 1 {
			t.Errorf("period %v: the job completed %d times, want at most once: %v", p, len(oks), oks)
		}
	}
	for _, p := range full {
		var fail, ok []line
		for _, l := range byPeriod[p.Unix()] {
			switch l.what {
			case "fail":
				fail = append(fail, l)
			case "ok":
				ok = append(ok, l)
			}
		}
		if len(ok) != 1 || len(fail) != 1 {
			t.Errorf("period %v: %d ok and %d failed runs, want exactly 1 of each: %v", p, len(ok), len(fail), byPeriod[p.Unix()])
			continue
		}
		if ok[0].id == fail[0].id {
			t.Errorf("period %v: retried by the process that failed (%s), want another", p, ok[0].id)
		}
		// Within the period, with 1 s for `date`'s whole seconds.
		if ok[0].at.Before(p.Add(-9*time.Second)) || !ok[0].at.Before(p.Add(time.Minute+time.Second)) {
			t.Errorf("period %v: completed at %v, outside the period", p, ok[0].at)
		}
	}
}
