// Package diskfault slows or hangs a lockd node's Raft disk writes, for
// tests only.
//
// When the environment variable named by EnvDelayFile names a file, the
// server wraps its Raft log store and stable store so that every write
// (StoreLog, StoreLogs, DeleteRange, Set, SetUint64: each one a write and
// an fsync in raft-wal) first looks at the file:
//
//   - missing, empty or unreadable: no delay;
//   - a Go duration ("300ms"): the write waits that long (a slow disk);
//   - "hang": the write blocks until the content changes (a hung disk).
//
// The file is read at most every Recheck, so a busy log pays one read per
// 50 ms, not one per write. Without the variable nothing is wrapped and
// writes cost nothing extra. The variable is not part of lockd's
// interface; the chaos tool's node-disk-slow and node-disk-hang faults use
// it, so a test needs no FUSE file system, dm-delay device or root.
package diskfault

import (
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// EnvDelayFile names the environment variable with the path of the delay
// file (tests only).
const EnvDelayFile = "LOCKD_TEST_DISK_DELAY_FILE"

// Recheck is how long the file's content is trusted before it is read
// again; also how often a hung write looks whether the hang is over.
const Recheck = 50 * time.Millisecond

// hang is the file content that blocks writes.
const hang = "hang"

// Fault reads the delay file and delays writes by what it says.
type Fault struct {
	path string

	mu      sync.Mutex
	read    time.Time // when content was read; zero: never
	content string
}

// FromEnv returns the fault of the file named by EnvDelayFile, or nil when
// the variable is unset.
func FromEnv() *Fault {
	p := os.Getenv(EnvDelayFile)
	if p == "" {
		return nil
	}
	return New(p)
}

// New returns the fault of the file at path.
func New(path string) *Fault { return &Fault{path: path} }

// current returns the file's content, read again when the cached one is
// older than Recheck.
func (f *Fault) current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.read.IsZero() || time.Since(f.read) >= Recheck {
		b, err := os.ReadFile(f.path)
		f.content = ""
		if err == nil {
			f.content = strings.TrimSpace(string(b))
		}
		f.read = time.Now()
	}
	return f.content
}

// Wait delays one write by what the file says: nothing, a duration, or
// until a "hang" is replaced.
func (f *Fault) Wait() {
	for f.current() == hang {
		time.Sleep(Recheck)
	}
	if d, err := time.ParseDuration(f.current()); err == nil && d > 0 {
		time.Sleep(d)
	}
}

// LogStore returns ls with every write delayed by f; ls itself when f is
// nil.
func (f *Fault) LogStore(ls raft.LogStore) raft.LogStore {
	if f == nil {
		return ls
	}
	return &logStore{LogStore: ls, f: f}
}

// StableStore returns ss with every write delayed by f; ss itself when f
// is nil.
func (f *Fault) StableStore(ss raft.StableStore) raft.StableStore {
	if f == nil {
		return ss
	}
	return &stableStore{StableStore: ss, f: f}
}

type logStore struct {
	raft.LogStore
	f *Fault
}

func (s *logStore) StoreLog(l *raft.Log) error {
	s.f.Wait()
	return s.LogStore.StoreLog(l)
}

func (s *logStore) StoreLogs(logs []*raft.Log) error {
	s.f.Wait()
	return s.LogStore.StoreLogs(logs)
}

func (s *logStore) DeleteRange(lo, hi uint64) error {
	s.f.Wait()
	return s.LogStore.DeleteRange(lo, hi)
}

// IsMonotonic passes on the wrapped store's answer: hashicorp/raft must
// still see raft-wal as monotonic (see the server's countingLogStore).
func (s *logStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

type stableStore struct {
	raft.StableStore
	f *Fault
}

func (s *stableStore) Set(k, v []byte) error {
	s.f.Wait()
	return s.StableStore.Set(k, v)
}

func (s *stableStore) SetUint64(k []byte, v uint64) error {
	s.f.Wait()
	return s.StableStore.SetUint64(k, v)
}
