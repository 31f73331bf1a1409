package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lockd snapshot save goes through the client like every other command:
// a dead endpoint first in the list is passed over, the backup is written
// whole, and a server restores from it.
func TestSnapshotSave(t *testing.T) {
	s := startServer(t)
	holder := startRun(t, s, "--ttl", "5s", "snap/a", "--", "sleep", "1000")
	if !poll(10*time.Second, func() bool { out, _, _ := lockdCLI(t, s.url, "ls", "snap/"); return strings.Contains(out, "snap/a") }) {
		t.Fatalf("holder did not get the lock: %s", holder.output())
	}
	file := filepath.Join(t.TempDir(), "backup.snap")
	out, errOut, code := lockdCLI(t, freePort(t)+","+s.url, "snapshot", "save", file)
	if code != 0 {
		t.Fatalf("lockd snapshot save: exit %d: %s%s", code, out, errOut)
	}
	if !strings.HasPrefix(out, "saved ") {
		t.Errorf("lockd snapshot save said %q, want \"saved N bytes …\"", out)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Size() == 0 {
		t.Fatalf("backup %s: %v, size %v", file, err, fi)
	}
	r := startNode(t, filepath.Join(t.TempDir(), "restored"), freePort(t), freePort(t), "/readyz", "--restore", file)
	if out, errOut, code := lockdCLI(t, r.url, "ls", "snap/"); code != 0 || !strings.Contains(out, "snap/a") {
		t.Errorf("restored server: ls exit %d: %s%s, want snap/a", code, out, errOut)
	}
	// A bad path fails as a local error, not "unavailable".
	if _, _, code := lockdCLI(t, s.url, "snapshot", "save", filepath.Join(t.TempDir(), "no", "such", "dir", "x")); code != exitFailure {
		t.Errorf("save into a missing directory: exit %d, want %d", code, exitFailure)
	}
	// A dead cluster: exit 69.
	if _, _, code := lockdCLI(t, freePort(t), "snapshot", "save", "--connect-timeout", "500ms", file); code != exitUnavailable {
		t.Errorf("save from a dead cluster: exit %d, want %d", code, exitUnavailable)
	}
}
