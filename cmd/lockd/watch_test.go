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
	cl, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
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

// lockd watch --from with a position of another cluster (here: another
// node's; in life, the cluster a backup was restored from) prints a RESET
// line first, not the events after that index in this cluster's log with
// the ones before it skipped.
func TestWatchCommandForeignPosition(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	churn := func(url string, n int) *lockd.Client {
		cl, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(url))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close(context.Background()) })
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			m := s.NewMutex("jobs/a")
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return cl
	}
	a, b := lockdtest.New(t), lockdtest.New(t)
	ca := churn(a.URL(), 1)
	var saved string
	for ev, err := range ca.Watch(ctx, "jobs/", lockd.WatchFrom("0.0")) {
		if err != nil {
			t.Fatal(err)
		}
		saved = ev.Position
		break
	}
	churn(b.URL(), 5) // b's log passes the saved index

	var stdout, stderr lockedBuffer
	cmd := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		if k == endpointsEnv {
			return b.URL()
		}
		return ""
	}}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.Run(wctx, []string{"watch", "jobs/", "--from", saved}) }()
	for !strings.Contains(stdout.String(), "\n") && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v (stderr %q)", err, stderr.String())
	}
	first, _, _ := strings.Cut(stdout.String(), "\n")
	if f := strings.Split(first, "\t"); len(f) < 2 || f[1] != "RESET" {
		t.Fatalf("first line %q from another cluster's position %s, want a RESET", first, saved)
	}
}
