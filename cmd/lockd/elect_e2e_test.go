package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lockdProc is a lockd client process (elect, observe, watch) writing its
// stdout to a file.
type lockdProc struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
}

func startLockd(t *testing.T, endpoints string, args ...string) *lockdProc {
	t.Helper()
	needBinary(t)
	f, err := os.CreateTemp(t.TempDir(), "proc-*.out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &lockdProc{out: f.Name(), done: make(chan struct{})}
	p.cmd = exec.Command(lockdBin, args...)
	p.cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+endpoints)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// lines returns the complete lines the process wrote so far.
func (p *lockdProc) lines() []string {
	b, _ := os.ReadFile(p.out)
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.Split(s[:i], "\n")
	}
	return nil
}

// leaders parses `lockd observe --json` output.
func leaders(t *testing.T, p *lockdProc) []observed {
	t.Helper()
	var out []observed
	for _, l := range p.lines() {
		var o observed
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("observe printed %q: %v", l, err)
		}
		out = append(out, o)
	}
	return out
}

// Five `lockd elect` processes campaign; the leader's process is killed
// with SIGKILL, twice: each time exactly one new leader follows within
// TTL + grace + 1 s, observers see every change in order with increasing
// tokens, and the server's history never shows two leaders at once.
func TestElectKillLeader(t *testing.T) {
	srv := startServer(t)
	const ttl = 2 * time.Second
	dir := t.TempDir()
	obs := []*lockdProc{
		startLockd(t, srv.url, "observe", "--json", "election/job"),
		startLockd(t, srv.url, "observe", "--json", "election/job"),
	}
	for _, o := range obs {
		if !poll(15*time.Second, func() bool { return len(o.lines()) > 0 }) {
			t.Fatal("an observer printed nothing")
		}
	}
	// Each candidate's command records its token when it starts.
	cands := map[string]*lockdProc{}
	for i := range 5 {
		name := fmt.Sprintf("cand-%d", i)
		cands[name] = startLockd(t, srv.url, "elect", "--ttl", ttl.String(), "election/job", name, "--",
			"sh", "-c", `echo "$LOCKD_TOKEN" > "$0"; exec sleep 300`, filepath.Join(dir, name))
	}
	waitFor := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		if !poll(timeout, cond) {
			t.Fatalf("%s: not within %v; observer saw %+v", what, timeout, leaders(t, obs[0]))
		}
	}
	current := func() observed {
		ls := leaders(t, obs[0])
		if len(ls) == 0 {
			return observed{}
		}
		return ls[len(ls)-1]
	}
	waitFor("a first leader", 15*time.Second, func() bool { return current().Leader })
	bound := ttl + testGrace + time.Second
	for round := range 2 {
		old := current()
		killed := cands[old.Value]
		if killed == nil {
			t.Fatalf("leader %+v is no candidate", old)
		}
		start := time.Now()
		if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-killed.done
		delete(cands, old.Value)
		waitFor("a new leader", 10*bound, func() bool { c := current(); return c.Leader && c.Token != old.Token })
		took := time.Since(start)
		t.Logf("round %d: %s (token %d) killed; %s (token %d) leads after %v (bound TTL %v + grace %v + 1s = %v)",
			round+1, old.Value, old.Token, current().Value, current().Token, took.Round(time.Millisecond), ttl, testGrace, bound)
		// The expiry comes by TTL + grace after the last keepalive, so
		// the bound holds with a second to spare; the assertion leaves room
		// for a loaded machine (the measurement is printed above).
		if took > 2*bound {
			t.Errorf("round %d: new leader after %v, more than twice %v", round+1, took, bound)
		}
		if _, alive := cands[current().Value]; !alive {
			t.Fatalf("new leader %+v is not a live candidate", current())
		}
		leader := current()
		waitFor("the new leader's command", 10*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(dir, leader.Value))
			return err == nil && strings.TrimSpace(string(b)) == fmt.Sprint(leader.Token)
		})
	}

	// Observers: the same sequence, no leader at first, then leaders with
	// increasing tokens and no gap (a handover is one change).
	want := leaders(t, obs[0])
	waitFor("the second observer", 10*time.Second, func() bool { return len(leaders(t, obs[1])) >= len(want) })
	if got := leaders(t, obs[1]); !slices.Equal(got, want) {
		t.Logf("%s", obs[1].lines())
		t.Fatalf("observers disagree:\n%+v\n%+v", got, want)
	}
	if len(want) != 4 || want[0].Leader {
		t.Fatalf("observed %+v, want no leader then 3 leaders", want)
	}
	for i := 2; i < len(want); i++ {
		if !want[i].Leader || want[i].Token <= want[i-1].Token {
			t.Fatalf("change %d: %+v after %+v, want a leader with a higher token", i, want[i], want[i-1])
		}
	}

	// The server's history: grants and ends of the election's lock
	// alternate, so no two leaders ever overlapped.
	hist := startLockd(t, srv.url, "watch", "--json", "--from", "0.0", "election/job")
	var held uint64
	grants := 0
	waitFor("the history", 10*time.Second, func() bool { return strings.Count(strings.Join(hist.lines(), "\n"), "EVENT_KIND_GRANTED") >= 3 })
	for _, l := range hist.lines() {
		var ev struct {
			Kind  string `json:"kind"`
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("watch printed %q: %v", l, err)
		}
		switch ev.Kind {
		case "EVENT_KIND_GRANTED":
			if held != 0 {
				t.Fatalf("token %s granted while token %d still leads", ev.Token, held)
			}
			fmt.Sscan(ev.Token, &held)
			grants++
		case "EVENT_KIND_RELEASED", "EVENT_KIND_EXPIRED", "EVENT_KIND_FORCE_RELEASED":
			var tok uint64
			fmt.Sscan(ev.Token, &tok)
			if tok != held {
				t.Fatalf("token %d ended while token %d leads", tok, held)
			}
			held = 0
		}
	}
	if grants != 3 {
		t.Fatalf("%d grants in the history, want 3", grants)
	}
}
