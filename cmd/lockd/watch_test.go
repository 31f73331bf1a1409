package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a poller.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lockd watch --json prints one JSON event a line, from --from, until
// interrupted (which is not an error).
func TestWatchCommand(t *testing.T) {
	srv := lockdtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cl, err := lockd.New(lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(ctx)
	s, err := cl.NewSession(ctx, lockd.WithOwner("cli-test"))
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMutex("jobs/a")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr lockedBuffer
	cmd := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		if k == endpointsEnv {
			return srv.URL()
		}
		return ""
	}}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.Run(wctx, []string{"watch", "jobs/", "--json", "--from", "0.0"}) }()
	for strings.Count(stdout.String(), "\n") < 2 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v (stderr %q)", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	for i, kind := range []string{"EVENT_KIND_GRANTED", "EVENT_KIND_RELEASED"} {
		if !strings.Contains(lines[i], `"kind":"`+kind+`"`) || !strings.Contains(lines[i], `"name":"jobs/a"`) || !strings.Contains(lines[i], `"owner":"cli-test"`) {
			t.Errorf("line %d: %s, want a %s of jobs/a", i, lines[i], kind)
		}
	}
}
