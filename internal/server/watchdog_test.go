package server

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// hangingStore is a real log store whose writes block while hang is set: a
// hung disk, which a real disk cannot be made to do on demand.
type hangingStore struct {
	raft.LogStore
	mu      sync.Mutex
	hang    bool
	release chan struct{}
}

func (h *hangingStore) StoreLogs(logs []*raft.Log) error {
	h.mu.Lock()
	hang, ch := h.hang, h.release
	h.mu.Unlock()
	if hang {
		<-ch
	}
	return h.LogStore.StoreLogs(logs)
}

func (h *hangingStore) StoreLog(l *raft.Log) error { return h.StoreLogs([]*raft.Log{l}) }

func TestWatchdogTripsOnHungDisk(t *testing.T) {
	store := &hangingStore{release: make(chan struct{})}
	fatal := make(chan error, 1)
	cfg := testConfig(t.TempDir())
	cfg.WatchdogTimeout = 300 * time.Millisecond
	s, err := New(cfg,
		WithLogStoreWrapper(func(ls raft.LogStore) raft.LogStore { store.LogStore = ls; return store }),
		WithFatal(func(err error) { fatal <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctxWait(t, s)
	propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "a", TtlMs: 60000})

	store.mu.Lock()
	store.hang = true
	store.mu.Unlock()
	start := time.Now()
	go s.node.Propose(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "b", TtlMs: 60000})
	select {
	case err := <-fatal:
		t.Logf("watchdog fired after %v: %v", time.Since(start), err)
		if !strings.Contains(err.Error(), "stalled") {
			t.Fatalf("fatal error %q does not say proposals stalled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watchdog did not fire for a hung disk")
	}
	if el := time.Since(start); el < cfg.WatchdogTimeout {
		t.Fatalf("watchdog fired after %v, before its limit %v", el, cfg.WatchdogTimeout)
	}
	if got := counterValue(t, s.nd.Hooks().WatchdogTrips()); got < 1 {
		t.Fatalf("watchdog trips metric %v, want ≥ 1", got)
	}
	close(store.release) // let Close finish
}

func (h *hangingStore) IsMonotonic() bool {
	m, ok := h.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
