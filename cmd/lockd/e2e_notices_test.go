package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReleaseRequestedOldServer: against a server older than release
// requests (the lockd of gateBaseCommit: a session stream, no
// SubscribeNotices), a client whose lock wants notices says so once and
// watches the lock instead of subscribing again and again.
func TestReleaseRequestedOldServer(t *testing.T) {
	oldBin := buildOldLockd(t)
	srv := startNodeBin(t, oldBin, filepath.Join(t.TempDir(), "data"), freePort(t), freePort(t), "/readyz")
	var logs syncBuffer
	c, err := lockd.New(lockd.WithEndpoints(srv.url), lockd.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	s, err := c.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMutex("old/job")
	m.ReleaseRequested()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool { return scrapeMetric(t, srv.url, "lockd_watch_streams_open") >= 1 }) {
		t.Fatalf("the client did not watch the lock; it logged:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "does not know SubscribeNotices"); n != 1 {
		t.Errorf("the old server was reported %d times, want once; the client logged:\n%s", n, logs.String())
	}
}
