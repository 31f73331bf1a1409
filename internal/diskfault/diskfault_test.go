package diskfault

import (
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
)

// The stores under the fault are hashicorp/raft's in-memory stores: the
// fault only delays calls, so any real store shows it.

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// took returns how long f took on the bubble's clock.
func took(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func TestNilFaultWrapsNothing(t *testing.T) {
	t.Setenv(EnvDelayFile, "")
	f := FromEnv()
	if f != nil {
		t.Fatalf("FromEnv without the variable = %v, want nil", f)
	}
	s := raft.NewInmemStore()
	if f.LogStore(s) != raft.LogStore(s) || f.StableStore(s) != raft.StableStore(s) {
		t.Fatal("a nil fault wrapped a store")
	}
}

func TestDelayPerWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "disk")
		f := New(path)
		mem := raft.NewInmemStore()
		ls, ss := f.LogStore(mem), f.StableStore(mem)

		// Missing file: no delay.
		if d, err := took(func() error { return ls.StoreLog(&raft.Log{Index: 1}) }); err != nil || d != 0 {
			t.Fatalf("StoreLog without a file took %v (%v), want 0", d, err)
		}
		write(t, path, "300ms\n")
		time.Sleep(Recheck) // the cached "no file" expires
		for _, w := range []struct {
			name string
			call func() error
		}{
			{"StoreLogs", func() error { return ls.StoreLogs([]*raft.Log{{Index: 2}, {Index: 3}}) }},
			{"DeleteRange", func() error { return ls.DeleteRange(3, 3) }},
			{"Set", func() error { return ss.Set([]byte("k"), []byte("v")) }},
			{"SetUint64", func() error { return ss.SetUint64([]byte("term"), 7) }},
		} {
			if d, err := took(w.call); err != nil || d != 300*time.Millisecond {
				t.Errorf("%s took %v (%v), want 300ms", w.name, d, err)
			}
		}
		if v, err := ss.GetUint64([]byte("term")); err != nil || v != 7 {
			t.Fatalf("GetUint64 = %d, %v: the delayed write was not stored", v, err)
		}
		if last, _ := ls.LastIndex(); last != 2 {
			t.Fatalf("LastIndex = %d, want 2", last)
		}
		// Reads are never delayed.
		if d, _ := took(func() error { _, err := ss.Get([]byte("k")); return err }); d != 0 {
			t.Fatalf("Get took %v, want 0", d)
		}
		// Garbage: no delay.
		write(t, path, "slow")
		time.Sleep(Recheck)
		if d, _ := took(func() error { return ls.StoreLog(&raft.Log{Index: 3}) }); d != 0 {
			t.Fatalf("StoreLog with garbage took %v, want 0", d)
		}
	})
}

// The file is read at most every Recheck: a change shows after that.
func TestContentCached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "disk")
		f := New(path)
		ls := f.LogStore(raft.NewInmemStore())
		if err := ls.StoreLog(&raft.Log{Index: 1}); err != nil {
			t.Fatal(err)
		}
		write(t, path, "1s")
		if d, _ := took(func() error { return ls.StoreLog(&raft.Log{Index: 2}) }); d != 0 {
			t.Fatalf("a write within Recheck of the last read took %v, want 0 (cached)", d)
		}
		time.Sleep(Recheck)
		if d, _ := took(func() error { return ls.StoreLog(&raft.Log{Index: 3}) }); d != time.Second {
			t.Fatalf("a write after Recheck took %v, want 1s", d)
		}
	})
}

func TestHangUntilContentChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "disk")
		write(t, path, "hang")
		ls := New(path).LogStore(raft.NewInmemStore())
		done := make(chan error, 1)
		go func() { done <- ls.StoreLogs([]*raft.Log{{Index: 1}}) }()
		time.Sleep(10 * time.Second) // longer than any delay: the write still waits
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("StoreLogs returned (%v) while the disk hangs", err)
		default:
		}
		write(t, path, "")
		time.Sleep(Recheck)
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("StoreLogs still blocked after the hang ended")
		}
		if last, _ := ls.LastIndex(); last != 1 {
			t.Fatalf("LastIndex = %d, want 1", last)
		}
	})
}
