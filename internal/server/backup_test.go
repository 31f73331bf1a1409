package server

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestBackupRestore10kLocks: a 10 000-lock state survives `GET
// /v1/snapshot`, a restore into a fresh cluster, and comparison; the new
// cluster has a new id and issues tokens above every old one.
func TestBackupRestore10kLocks(t *testing.T) {
	if testing.Short() {
		t.Skip("10k-lock backup in -short mode")
	}
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	const sessions, perSession = 100, 110
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("s", i)
			b, _ := fsm.Encode(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 600000, SecretHash: testSecretHash})
			if err := s.raft.Apply(b, 0).Error(); err != nil {
				errs <- err
				return
			}
			for j := range perSession {
				// Every session takes its own 100 locks, then queues on
				// 10 shared ones, so queues are in the backup too.
				name := fmt.Sprintf("lock/%d/%d", i, j)
				if j >= 100 {
					name = fmt.Sprintf("shared/%d", j-100)
				}
				b, _ := fsm.Encode(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: id, Seq: uint64(j + 1), Name: name, Mode: fsm.ModeExclusive, Wait: true, SecretHash: testSecretHash})
				f := s.raft.Apply(b, 0)
				if err := f.Error(); err != nil {
					errs <- err
					return
				}
				if r := f.Response().(*fsm.Result); r.Code != fsm.OK {
					errs <- r.Err()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	before := s.fsm.State()
	if n := len(before.Locks); n < 10000 {
		t.Fatalf("only %d locks in the state", n)
	}

	file := downloadBackup(t, s)
	t.Logf("backup of %d locks, %d sessions: %d bytes", len(before.Locks), len(before.Sessions), fileSize(t, file))

	cfg := testConfig(t.TempDir())
	cfg.Restore = file
	r := startServer(t, cfg)
	defer r.Close()
	after := r.fsm.State()
	if after.ClusterId == before.ClusterId {
		t.Fatal("restored cluster kept the old cluster id")
	}
	if after.LastToken < before.LastToken {
		t.Fatalf("restored last token %d below the backup's %d", after.LastToken, before.LastToken)
	}
	if !proto.Equal(&fsmv1.Snapshot{Sessions: after.Sessions, Locks: after.Locks}, &fsmv1.Snapshot{Sessions: before.Sessions, Locks: before.Locks}) {
		t.Fatal("restored sessions or locks differ from the backup")
	}
	// A fresh grant in the new cluster is above every old token.
	propose(t, r, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "new", TtlMs: 60000})
	g := propose(t, r, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "new", Seq: 1, Name: "fresh", Mode: fsm.ModeExclusive})
	if g.Token <= before.LastToken {
		t.Fatalf("new token %d not above the old cluster's last token %d", g.Token, before.LastToken)
	}
	// The restored sessions' leases run on the new leader.
	if _, ok := r.lease.Deadline("s0"); !ok {
		t.Fatal("restored session has no lease timer")
	}
	// A restore into a data dir with state is refused.
	r.Close()
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	if x, err := New(cfg); err == nil {
		x.Close()
		t.Fatal("restore into a data dir with state was accepted")
	}
}

// TestRestoreRefusesAtStartWhatApplyRefuses: a backup whose token counter
// is a valid state but too high for a new cluster's epoch to continue from
// is refused by `lockd serve --restore` at start, with the reason, instead
// of a node that starts and proposes a Restore Apply refuses on every try.
func TestRestoreRefusesAtStartWhatApplyRefuses(t *testing.T) {
	b, err := fsm.EncodeSnapshot(&fsmv1.Snapshot{ClusterId: "old", Epoch: 1<<62 - 1, LastToken: 1<<62 + 5})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "backup.lockd")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t.TempDir())
	cfg.Restore = file
	x, err := New(cfg)
	if err == nil {
		x.Close()
		t.Fatal("a backup the Restore command refuses was accepted at start")
	}
	if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "last token") {
		t.Fatalf("refusal %q: want the file and the reason", err)
	}
}

// downloadBackup downloads s's backup (GET /v1/snapshot, as lockd snapshot
// does) into a file and returns its name.
func downloadBackup(t *testing.T, s *Server) string {
	t.Helper()
	resp, err := http.Get(s.URL() + "/v1/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	backup, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("snapshot: %d %v", resp.StatusCode, err)
	}
	file := filepath.Join(t.TempDir(), "backup.lockd")
	if err := os.WriteFile(file, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func fileSize(t *testing.T, name string) int64 {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
