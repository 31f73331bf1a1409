package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// cliStatus runs lockd against url in-process and returns its stdout and
// exit status (what a script sees).
func cliStatus(t *testing.T, url string, args ...string) (string, int) {
	t.Helper()
	stdout, stderr, err := runMain(t, url, args...)
	var msg strings.Builder
	m := &Main{Stdout: io.Discard, Stderr: &msg}
	code := m.exitStatus(err)
	return stdout + stderr + msg.String(), code
}

func testSession(t *testing.T, url string) *lockd.Session {
	t.Helper()
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	s, err := c.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCheckCommand: `lockd check NAME TOKEN`
// exits 0 for a current token, 1 for a stale one, 64 for bad arguments
// and 69 when no server answers.
func TestCheckCommand(t *testing.T) {
	srv := lockdtest.New(t)
	ctx := t.Context()
	a, b := testSession(t, srv.URL()), testSession(t, srv.URL())
	ma := a.NewMutex("stock/laptop")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old := strconv.FormatUint(ma.Token(), 10)
	if out, code := cliStatus(t, srv.URL(), "check", "stock/laptop", old); code != 0 || !strings.Contains(out, "is current") {
		t.Errorf("check of the held token: exit %d, %q; want 0, current", code, out)
	}
	if out, code := cliStatus(t, srv.URL(), "check", "--json", "stock/laptop", old); code != 0 || !strings.Contains(out, `"valid": true`) || !strings.Contains(out, a.ID()) {
		t.Errorf("check --json: exit %d, %q", code, out)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mb := b.NewMutex("stock/laptop")
	if err := mb.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	cur := strconv.FormatUint(mb.Token(), 10)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check", "stock/laptop", old}, 1, "is stale"},
		{[]string{"check", "stock/laptop", cur}, 0, "is current"},
		{[]string{"check", "--json", "stock/laptop", old}, 1, `"valid": false`},
		{[]string{"check", "other", cur}, 1, "is stale"},
		{[]string{"check", "stock/laptop", "abc"}, exitUsage, "positive decimal"},
		{[]string{"check", "stock/laptop", "0"}, exitUsage, "positive decimal"},
		{[]string{"check", "stock/laptop"}, exitUsage, "usage"},
		{[]string{"check", "", cur}, exitUsage, "invalid"},
		{[]string{"check", "--timeout", "1s", "--connect-timeout", "1s", "--endpoints", "127.0.0.1:1", "stock/laptop", cur}, exitUnavailable, "check"},
	} {
		out, code := cliStatus(t, srv.URL(), tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Errorf("lockd %s: exit %d, %q; want %d and %q", strings.Join(tt.args, " "), code, out, tt.code, tt.want)
		}
	}
}

// TestMarkClearAndDescribe: describe shows a lock's completion mark and
// lock-delay (text and JSON); `lockd mark clear` ends the mark at once, so
// the next acquire is granted; --token clears only that mark.
func TestMarkClearAndDescribe(t *testing.T) {
	srv := lockdtest.New(t)
	ctx := t.Context()
	s := testSession(t, srv.URL())
	m := s.NewMutex("invoices/2026-11", lockd.WithLockDelay(5*time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := cliStatus(t, srv.URL(), "describe", "invoices/2026-11"); code != 0 || !strings.Contains(out, "lock-delay: 5s after an expired holder") {
		t.Errorf("describe of a held lock: exit %d, %q; want its lock-delay", code, out)
	}
	token := m.Token()
	tok := strconv.FormatUint(token, 10)
	if err := m.Complete(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"describe", "invoices/2026-11"}, []string{"is done", "token " + tok, "mark kept 1h0m0s", "lock-delay: 5s", "lockd mark clear invoices/2026-11 --token " + tok}},
		{[]string{"describe", "--json", "invoices/2026-11"}, []string{`"mark": {`, `"token": "` + tok + `"`, `"retention": "3600s"`, `"lockDelay": "5s"`}},
		{[]string{"mark", "clear", "invoices/2026-11", "--token", strconv.FormatUint(token+1, 10)}, []string{"no mark with token"}},
	} {
		out, code := cliStatus(t, srv.URL(), tt.args...)
		for _, w := range tt.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("lockd %s: exit %d, %q; want 0 and %q", strings.Join(tt.args, " "), code, out, w)
			}
		}
	}
	if err := s.NewMutex("invoices/2026-11").TryLock(ctx); !errors.Is(err, lockd.ErrAlreadyDone) {
		t.Fatalf("TryLock with the mark: %v, want ErrAlreadyDone", err)
	}
	if out, code := cliStatus(t, srv.URL(), "mark", "clear", "--json", "invoices/2026-11"); code != 0 || !strings.Contains(out, `"token": "`+tok+`"`) {
		t.Fatalf("mark clear: exit %d, %q", code, out)
	}
	again := s.NewMutex("invoices/2026-11")
	if err := again.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after mark clear: %v, want a grant", err)
	}
	if again.Token() <= token {
		t.Errorf("new token %d, want above %d", again.Token(), token)
	}
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"mark", "clear", "nothing/here"}, 0, "has no completion mark"},
		{[]string{"mark", "clear"}, exitUsage, "usage"},
		{[]string{"mark", "show", "x"}, exitUsage, "usage"},
		{[]string{"mark"}, exitUsage, "usage"},
	} {
		out, code := cliStatus(t, srv.URL(), tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Errorf("lockd %s: exit %d, %q; want %d and %q", strings.Join(tt.args, " "), code, out, tt.code, tt.want)
		}
	}
}
