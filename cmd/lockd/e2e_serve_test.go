package main

// End-to-end tests of `lockd serve` itself, with real processes: a kill -9
// and restart on the same data dir keeps every hold, wait and token, and a
// wiped node starts a new cluster whose tokens are still above every earlier
// one; the data dir lock; bad flags; and the JSON
// API as `curl` uses it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"

	"github.com/lockd-dev/lockd/lockdtest"
)

// describedLock is the part of `lockd describe --json` the tests read.
type describedLock struct {
	Name    string `json:"name"`
	Holders []struct {
		SessionID string `json:"sessionId"`
		Mode      string `json:"mode"`
		Token     string `json:"token"`
	} `json:"holders"`
	Waiters []struct {
		SessionID string `json:"sessionId"`
	} `json:"waiters"`
}

// describe runs `lockd describe NAME --json` against s; nil means the lock
// does not exist (free, nobody waiting).
func describe(t *testing.T, s *lockdServer, name string) *describedLock {
	t.Helper()
	cmd := exec.Command(lockdBin, "describe", "--endpoints", s.url, "--timeout", "5s", "--json", name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lockd describe %s: %v: %s", name, err, stderr.String())
	}
	var resp struct {
		Lock *describedLock `json:"lock"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("lockd describe %s: %v: %s", name, err, out)
	}
	return resp.Lock
}

func parseToken(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		t.Fatalf("token %q: want a positive decimal uint64 (%v)", s, err)
	}
	return n
}

// restartHold is one hold that must survive the server's restart.
type restartHold struct {
	name    string
	ttl     time.Duration
	run     *runProc // nil for the Go client's hold
	token   uint64
	session string
}

// Acceptance 3: kill -9 of the server while sessions with TTL 10 s (and 3 s)
// hold locks, restart on the same data dir and ports within 3 s: the holds
// survive with the same tokens and sessions, their keepalives resume (a 3 s
// session still holds 4 s after the restart), a waiter stays queued and is
// not granted while its holder lives, and new tokens are higher than every
// earlier one. Then wipe the data dir and start afresh: a new cluster whose
// tokens are still above every token issued before, and whose address the
// old cluster's holders do not mistake for their own.
func TestServerRestart(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	api, raftAddr := freePort(t), freePort(t)
	s := startServerAt(t, data, api, raftAddr)
	ctx := context.Background()

	// Holders: `lockd run` sessions with the acceptance's TTL 10 s, and with
	// TTL 3 s, which hold across the restart only if keepalives resume.
	holds := []*restartHold{
		{name: "restart/a", ttl: 10 * time.Second},
		{name: "restart/b", ttl: 10 * time.Second},
		{name: "restart/c", ttl: 3 * time.Second},
	}
	files := make([]string, len(holds))
	for i, h := range holds {
		files[i] = filepath.Join(dir, fmt.Sprintf("hold-%d", i))
		h.run = startRun(t, s, "--ttl", h.ttl.String(), h.name, "--", "sh", "-c",
			`echo $LOCKD_TOKEN $LOCKD_SESSION > "`+files[i]+`"; sleep 1000`)
	}
	for i, h := range holds {
		f := readFields(t, files[i], 2, 10*time.Second)
		h.token, h.session = parseToken(t, f[0]), f[1]
	}
	// And the Go client, TTL 3 s.
	cl, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(s.url), lockd.WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	sess, err := cl.NewSession(ctx, lockd.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mu := sess.NewMutex("restart/client")
	if err := mu.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	holds = append(holds, &restartHold{name: mu.Name(), ttl: sess.TTL(), token: mu.Token(), session: sess.ID()})
	oldCluster := cl.ClusterID()
	clientLost := make(chan time.Time, 1)
	context.AfterFunc(mu.Context(), func() { clientLost <- time.Now() })

	// A waiter (TTL 3 s) queued behind restart/a.
	waiterFile := filepath.Join(dir, "waiter")
	waiter := startRun(t, s, "--ttl", "3s", "restart/a", "--", "sh", "-c",
		`echo $LOCKD_TOKEN $LOCKD_SESSION > "`+waiterFile+`"`)
	var waiterSession string
	if !poll(10*time.Second, func() bool {
		l := describe(t, s, "restart/a")
		if l != nil && len(l.Waiters) == 1 {
			waiterSession = l.Waiters[0].SessionID
		}
		return waiterSession != ""
	}) {
		t.Fatalf("the waiter did not queue: %s", waiter.output())
	}

	var maxToken uint64
	for _, h := range holds {
		maxToken = max(maxToken, h.token)
	}
	// check verifies that every hold is there as before, alone, that the
	// waiter still waits, and that no holder was told it lost its lease.
	check := func(s *lockdServer, when string) {
		t.Helper()
		for _, h := range holds {
			l := describe(t, s, h.name)
			if l == nil || len(l.Holders) != 1 {
				t.Fatalf("%s: %s: holders %+v, want the one of session %s with token %d", when, h.name, l, h.session, h.token)
			}
			if got := l.Holders[0]; got.SessionID != h.session || got.Token != strconv.FormatUint(h.token, 10) {
				t.Fatalf("%s: %s: held by session %s with token %s, want session %s with token %d",
					when, h.name, got.SessionID, got.Token, h.session, h.token)
			}
			if h.name == "restart/a" && (len(l.Waiters) != 1 || l.Waiters[0].SessionID != waiterSession) {
				t.Fatalf("%s: restart/a: waiters %+v, want session %s alone", when, l.Waiters, waiterSession)
			}
			if h.run != nil {
				select {
				case <-h.run.done:
					t.Fatalf("%s: lockd run holding %s exited: %s", when, h.name, h.run.output())
				default:
				}
			}
		}
		select {
		case <-mu.Done():
			t.Fatalf("%s: the Go client lost its lease: %v", when, mu.Err())
		default:
		}
		if _, err := os.Stat(waiterFile); err == nil {
			t.Fatalf("%s: the waiter was granted restart/a while its holder lives: %s", when, waiter.output())
		}
	}
	check(s, "before the kill")

	// kill -9 the server, restart it on the same data dir and ports.
	killed := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.exited
	restarted := time.Since(killed)
	if restarted > 3*time.Second {
		t.Fatalf("restart began %v after the kill, want within 3s", restarted)
	}
	s = startServerAt(t, data, api, raftAddr)
	readyAt := time.Now()
	t.Logf("server killed; restarted %v and ready %v after the kill -9", restarted, readyAt.Sub(killed))
	check(s, "right after the restart")

	// Keep checking for 4 s after the restart: longer than TTL 3 s + grace
	// from the new leader's start, so the 3 s sessions hold only because
	// their keepalives resumed.
	checks := 0
	tick := time.NewTicker(100 * time.Millisecond)
	for time.Since(readyAt) < 4*time.Second {
		check(s, fmt.Sprintf("%v after the restart", time.Since(readyAt).Round(time.Millisecond)))
		checks++
		<-tick.C
	}
	tick.Stop()
	check(s, "4s after the restart")
	t.Logf("%d holds and 1 wait unchanged over %d checks in the 4s after the restart", len(holds), checks+1)

	// A new acquire gets a higher token than every earlier one.
	fresh := sess.NewMutex("restart/new")
	if err := fresh.TryLock(ctx); err != nil {
		t.Fatalf("acquire after the restart: %v", err)
	}
	if fresh.Token() <= maxToken {
		t.Errorf("token %d after the restart, want above every earlier one (%d)", fresh.Token(), maxToken)
	}
	maxToken = max(maxToken, fresh.Token())

	// The waiter queued before the kill is granted when the holder ends,
	// under its original session, with a higher token.
	released := time.Now()
	if err := holds[0].run.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := holds[0].run.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("holder of restart/a after SIGTERM: exit status %d, want %d: %s", code, 128+int(syscall.SIGTERM), holds[0].run.output())
	}
	f := readFields(t, waiterFile, 2, 10*time.Second)
	t.Logf("waiter granted %v after the holder was sent SIGTERM", time.Since(released))
	if wt := parseToken(t, f[0]); wt <= maxToken {
		t.Errorf("waiter's token %d, want above every earlier one (%d)", wt, maxToken)
	} else {
		maxToken = wt
	}
	if f[1] != waiterSession {
		t.Errorf("waiter granted under session %s, want its queued session %s", f[1], waiterSession)
	}
	if code := waiter.wait(t, 10*time.Second); code != 0 {
		t.Errorf("waiter: exit status %d: %s", code, waiter.output())
	}

	// Stop the server, wipe its data dir, and start a new cluster on the
	// same ports.
	stopped := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(35 * time.Second):
		t.Fatalf("lockd serve still running 35s after SIGTERM")
	}
	t.Logf("server stopped %v after SIGTERM (%v)", time.Since(stopped), s.cmd.ProcessState)
	if !s.cmd.ProcessState.Success() {
		t.Errorf("lockd serve after SIGTERM: %v, want exit status 0", s.cmd.ProcessState)
	}
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	s = startServerAt(t, data, api, raftAddr)
	t.Logf("new cluster ready %v after the stop", time.Since(stopped))
	afterWipe := filepath.Join(dir, "after-wipe")
	p := startRun(t, s, "--ttl", "3s", "--no-wait", "restart/a", "--", "sh", "-c", `echo $LOCKD_TOKEN > "`+afterWipe+`"`)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("acquire on the new cluster: exit status %d: %s", code, p.output())
	}
	if tok := parseToken(t, readFields(t, afterWipe, 1, time.Second)[0]); tok <= maxToken {
		t.Errorf("token %d on the wiped, new cluster, want above every earlier one (%d)", tok, maxToken)
	} else {
		t.Logf("token on the new cluster %d > %d, the last before the wipe", tok, maxToken)
	}

	// The old cluster's holders learn that their leases are gone: the new
	// cluster at the same address is not theirs.
	for _, h := range holds[1:] {
		// Each was last confirmed before the stop, so its client deadline
		// is less than a TTL after it.
		var ended time.Duration
		if h.run == nil {
			select {
			case at := <-clientLost:
				ended = at.Sub(stopped)
				t.Logf("Go client's hold of %s (TTL %v) ended %v after the stop: %v", h.name, h.ttl, ended, mu.Err())
			case <-time.After(h.ttl + 5*time.Second):
				t.Fatalf("Go client still holds %s on the old cluster %v after it stopped", h.name, time.Since(stopped))
			}
			if !errors.Is(mu.Err(), lockd.ErrLeaseLost) {
				t.Errorf("Go client's hold of %s: %v, want lease lost", h.name, mu.Err())
			}
		} else {
			code := h.run.wait(t, h.ttl+5*time.Second)
			ended = h.run.exitAt.Sub(stopped)
			t.Logf("lockd run holding %s (TTL %v) exited %d, %v after the stop: %s", h.name, h.ttl, code, ended, h.run.output())
			if code != exitStopped {
				t.Errorf("lockd run holding %s on the old cluster: exit status %d, want %d", h.name, code, exitStopped)
			}
		}
		if ended > h.ttl {
			t.Errorf("holder of %s on the old cluster stopped %v after the server, want within its TTL %v", h.name, ended, h.ttl)
		}
		if l := describe(t, s, h.name); l != nil {
			t.Errorf("new cluster has lock %s of the old one: %+v", h.name, l)
		}
	}
	out, err := exec.Command(lockdBin, "status", "--endpoints", s.url, "--json").Output()
	if err != nil {
		t.Fatalf("lockd status: %v", err)
	}
	var st struct {
		ClusterID string `json:"clusterId"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("lockd status --json: %v: %s", err, out)
	}
	if id := st.ClusterID; id == "" || id == oldCluster {
		t.Errorf("cluster id after the wipe %q, want a new one (old %q)", id, oldCluster)
	}
}

// serveOnce runs `lockd serve ARGS...` expecting it to exit by itself, and
// returns its exit status, stderr and run time.
func serveOnce(t *testing.T, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lockdBin, append([]string{"serve"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("lockd serve %s still running after 15s: %s", strings.Join(args, " "), stderr.String())
	}
	if stdout.Len() > 0 {
		t.Errorf("lockd serve %s: unexpected stdout %q", strings.Join(args, " "), stdout.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String(), took
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String(), took
	}
	t.Fatalf("lockd serve: %v", err)
	return -1, "", took
}

// wantOneLine checks that stderr is one "lockd: ..." line containing every
// want, and no panic.
func wantOneLine(t *testing.T, stderr string, want ...string) {
	t.Helper()
	msg := strings.TrimSpace(stderr)
	if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "lockd: ") {
		t.Errorf("stderr %q, want one line starting with \"lockd: \"", stderr)
	}
	if strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine ") {
		t.Errorf("stderr %q: a panic", stderr)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("stderr %q, want it to mention %q", msg, w)
		}
	}
}

// A second server on a data dir in use fails at once, saying so, and the
// first one keeps serving.
func TestServeDataDirInUse(t *testing.T) {
	needBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	api, raftAddr := freePort(t), freePort(t)
	s := startServerAt(t, data, api, raftAddr)
	for _, tt := range []struct{ name, api, raft string }{
		{"other ports", freePort(t), freePort(t)},
		{"same ports", api, raftAddr},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr, took := serveOnce(t, "--data-dir", data, "--listen", tt.api, "--raft-listen", tt.raft)
			t.Logf("second server exited %d after %v: %s", code, took, strings.TrimSpace(stderr))
			if code == 0 {
				t.Errorf("second server on %s: exit status 0, want a failure", data)
			}
			wantOneLine(t, stderr, "in use", filepath.Join(data, "LOCK"))
		})
	}
	resp, err := http.Get(s.url + "/readyz")
	if err != nil {
		t.Fatalf("first server after the attempts: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("first server after the attempts: /readyz %s", resp.Status)
	}
	if p := startRun(t, s, "--no-wait", "in-use", "--", "true"); p.wait(t, 10*time.Second) != 0 {
		t.Errorf("first server does not grant after the attempts: %s", p.output())
	}
}

// Bad flags: exit status 64 with a one-line reason, no panic, nothing
// started.
func TestServeBadFlags(t *testing.T) {
	needBinary(t)
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"listen not an address", []string{"--listen", "nonsense"}, []string{"listen", "nonsense"}},
		{"min-ttl above max-ttl", []string{"--min-ttl", "2h", "--max-ttl", "1h"}, []string{"min-ttl 2h0m0s is above max-ttl 1h0m0s; default-ttl"}},
		{"wildcard listen without advertise", []string{"--listen", "0.0.0.0:0"}, []string{"0.0.0.0:0", "wildcard", "advertise"}},
		{"wildcard raft-listen without raft-advertise", []string{"--raft-listen", ":0"}, []string{"raft-listen", "wildcard"}},
		{"election timeout zero", []string{"--election-timeout", "0s"}, []string{"election-timeout must be positive"}},
		{"argument", []string{"extra"}, []string{"no arguments", "extra"}},
		{"log level", []string{"--log-level", "loud"}, []string{"--log-level", "loud"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			args := append([]string{"--data-dir", data, "--listen", freePort(t), "--raft-listen", freePort(t)}, tt.args...)
			code, stderr, took := serveOnce(t, args...)
			t.Logf("exit %d after %v: %s", code, took, strings.TrimSpace(stderr))
			if code != exitUsage {
				t.Errorf("exit status %d, want %d", code, exitUsage)
			}
			wantOneLine(t, stderr, tt.want...)
		})
	}
	// An unknown flag prints the flags (the flag package's usage) before
	// the one-line reason, which comes last.
	t.Run("unknown flag", func(t *testing.T) {
		code, stderr, _ := serveOnce(t, "--data-dir", filepath.Join(t.TempDir(), "data"), "--bogus")
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != exitUsage {
			t.Errorf("exit status %d, want %d", code, exitUsage)
		}
		wantOneLine(t, lines[len(lines)-1], "-bogus")
	})
}

// postJSON POSTs body to the Connect JSON endpoint of method, as
// `curl -s -H 'Content-Type: application/json' -d BODY URL` does, and
// decodes the answer.
func postJSON(t *testing.T, s *lockdServer, method, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(s.url+"/lockd.v1.LockService/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q, want application/json", method, ct)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: answer %q is not JSON: %v", method, body, b, err)
	}
	return resp.StatusCode, m
}

// The JSON API with plain HTTP, as docs/curl.md's example uses it.
func TestJSONAPI(t *testing.T) {
	s := startServer(t)
	str := func(m map[string]any, key string) string {
		v, _ := m[key].(string)
		return v
	}
	wantOK := func(method string, code int, m map[string]any) {
		t.Helper()
		if code != http.StatusOK {
			t.Fatalf("%s: HTTP %d: %v", method, code, m)
		}
	}
	wantErr := func(method string, code int, m map[string]any, wantCode, wantMsg string) {
		t.Helper()
		if code == http.StatusOK || str(m, "code") != wantCode || !strings.Contains(str(m, "message"), wantMsg) {
			t.Errorf("%s: HTTP %d %v, want an error with code %q and a message mentioning %q", method, code, m, wantCode, wantMsg)
		}
	}

	// docs/curl.md's example.
	code, m := postJSON(t, s, "CreateSession", `{"ttl":"30s"}`)
	wantOK("CreateSession", code, m)
	id, secret := str(m, "sessionId"), str(m, "secret")
	if id == "" || secret == "" || str(m, "ttl") != "30s" || str(m, "clusterId") == "" {
		t.Fatalf("CreateSession: %v, want a sessionId, ttl 30s and a clusterId", m)
	}
	code, m = postJSON(t, s, "KeepAlive", `{"sessionId":"`+id+`","secret":"`+secret+`"}`)
	wantOK("KeepAlive", code, m)
	if str(m, "ttl") != "30s" {
		t.Errorf("KeepAlive: %v, want ttl 30s", m)
	}

	acquire := `{"sessionId":"` + id + `","secret":"` + secret + `","seq":1,"name":"json/invoice"}`
	code, m = postJSON(t, s, "Acquire", acquire)
	wantOK("Acquire", code, m)
	token := str(m, "token") // proto3 JSON: uint64 as a decimal string
	if str(m, "status") != "ACQUIRE_STATUS_GRANTED" {
		t.Fatalf("Acquire: %v, want status ACQUIRE_STATUS_GRANTED", m)
	}
	tok := parseToken(t, token)
	t.Logf("CreateSession %s, Acquire json/invoice: token %s", id, token)
	// A retry of the same request (same seq) answers the same grant.
	code, m = postJSON(t, s, "Acquire", acquire)
	wantOK("Acquire retry", code, m)
	if str(m, "token") != token {
		t.Errorf("Acquire retry: %v, want the first answer's token %s", m, token)
	}
	if l := describe(t, s, "json/invoice"); l == nil || len(l.Holders) != 1 || l.Holders[0].Token != token || l.Holders[0].SessionID != id {
		t.Errorf("describe json/invoice: %+v, want session %s with token %s", l, id, token)
	}

	// Another session (default TTL) finds it busy.
	code, m = postJSON(t, s, "CreateSession", `{}`)
	wantOK("CreateSession", code, m)
	id2, secret2 := str(m, "sessionId"), str(m, "secret")
	if str(m, "ttl") != "10s" {
		t.Errorf("CreateSession without ttl: %v, want the default ttl 10s", m)
	}
	code, m = postJSON(t, s, "Acquire", `{"sessionId":"`+id2+`","secret":"`+secret2+`","seq":"1","name":"json/invoice","mode":"MODE_EXCLUSIVE"}`)
	wantErr("Acquire of a held lock", code, m, "failed_precondition", "")

	// Release by token; then the other session gets a higher token.
	code, m = postJSON(t, s, "Release", `{"sessionId":"`+id+`","secret":"`+secret+`","seq":"2","name":"json/invoice","token":"`+token+`"}`)
	wantOK("Release", code, m)
	code, m = postJSON(t, s, "Acquire", `{"sessionId":"`+id2+`","secret":"`+secret2+`","seq":"2","name":"json/invoice"}`)
	wantOK("Acquire after release", code, m)
	if tok2 := parseToken(t, str(m, "token")); tok2 <= tok {
		t.Errorf("token %d after the release, want above %d", tok2, tok)
	}

	// Bad requests: clear errors, and the server keeps serving.
	code, m = postJSON(t, s, "CreateSession", `{"ttl":`)
	wantErr("malformed JSON", code, m, "invalid_argument", "")
	// proto3 JSON durations are seconds: "7200s", not "2h".
	code, m = postJSON(t, s, "CreateSession", `{"ttl":"2h"}`)
	wantErr("TTL not in seconds", code, m, "invalid_argument", "Duration")
	code, m = postJSON(t, s, "CreateSession", `{"ttl":"7200s"}`)
	wantErr("TTL out of bounds", code, m, "invalid_argument", "ttl")
	code, m = postJSON(t, s, "Acquire", `{"sessionId":"nosuchsession","seq":1,"name":"json/x"}`)
	wantErr("unknown session", code, m, "not_found", "session")
	code, m = postJSON(t, s, "CloseSession", `{"sessionId":"`+id+`","secret":"`+secret+`","seq":"3"}`)
	wantOK("CloseSession", code, m)
}
