package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/server"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// evilOwner retitles a terminal (OSC 0), rings its bell, clears it and
// carries a C1 CSI and a DEL.
const evilOwner = "a\x1b]0;pwned\x07\x1b[2J\u009b31m\x7fz"

// TestPrintable: control characters and invalid UTF-8 come out as Go
// escapes; printable UTF-8 (and a backslash) as it was.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"holder@a/42 é 名前 ✓": "holder@a/42 é 名前 ✓",
		`back\slash`:         `back\slash`,
		evilOwner:            `a\x1b]0;pwned\a\x1b[2J\u009b31m\x7fz`,
		"tab\tnl\n":          `tab\tnl\n`,
		"bad\xff\xc3":        `bad\xff\xc3`,
		"\u0085":             `\u0085`,
		"":                   "",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEscapeJSON: DEL and C1, which Go's JSON encoders leave raw, come out
// as \u escapes, and the document decodes to the same value.
func TestEscapeJSON(t *testing.T) {
	in, err := json.Marshal(map[string]string{"owner": evilOwner, "name": "名前 é"})
	if err != nil {
		t.Fatal(err)
	}
	out := escapeJSON(in)
	if strings.ContainsAny(string(out), "\x1b\x07\x7f\u009b") {
		t.Fatalf("escapeJSON left a control character: %q", out)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil || got["owner"] != evilOwner || got["name"] != "名前 é" {
		t.Fatalf("escapeJSON(%q) = %q, decodes to %q (%v)", in, out, got, err)
	}
}

// restoreWithOwner starts a real node from a backup whose state holds a
// session owned by owner: the state an older node (one that did not refuse
// control characters in owners) or its backup leaves. It is made by
// applying commands to an FSM directly, as such a node's Apply did (the
// FSM's Apply still accepts the owner: the refusal is the handler's, so
// versions agree), and encoding its snapshot. The session (with secret
// secret) holds "jobs/x" and waits for "jobs/y", held by another session;
// it returns the node's URL.
func restoreWithOwner(t *testing.T, owner, secret string) string {
	t.Helper()
	hash := sha256.Sum256([]byte(secret))
	f := fsm.New(nil)
	var index uint64
	apply := func(ct fsm.CmdType, m proto.Message) {
		t.Helper()
		b, err := fsm.Encode(ct, m)
		if err != nil {
			t.Fatal(err)
		}
		index++
		if r := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: b}).(*fsm.Result); r.Code != fsm.OK {
			t.Fatalf("command %d: %v", ct, r.Err())
		}
	}
	now := time.Now().UnixNano()
	apply(fsm.CmdInit, &fsmv1.Init{ClusterId: "old", Epoch: 1, TimeUnixNano: now})
	apply(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "evil", TtlMs: 3600_000, Owner: owner, SecretHash: hash[:], TimeUnixNano: now})
	apply(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "other", TtlMs: 3600_000, Owner: "other", SecretHash: hash[:], TimeUnixNano: now})
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "evil", Seq: 1, Name: "jobs/x", Mode: fsm.ModeExclusive, SecretHash: hash[:], TimeUnixNano: now})
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "other", Seq: 1, Name: "jobs/y", Mode: fsm.ModeExclusive, SecretHash: hash[:], TimeUnixNano: now})
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "evil", Seq: 2, Ack: 1, Name: "jobs/y", Mode: fsm.ModeExclusive, Wait: true, SecretHash: hash[:], TimeUnixNano: now})
	b, err := fsm.EncodeSnapshot(f.State())
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "backup.lockd")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Restore = t.TempDir(), file
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := srv.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return srv.URL()
}

// TestOwnerEscapedInOutput: an owner label with
// terminal escapes, in a state restored from an older node's backup,
// reaches the admin's terminal only escaped: lockd describe, sessions,
// top --once and watch print no ESC, BEL, C1 or DEL byte, and show the
// owner's escaped form.
func TestOwnerEscapedInOutput(t *testing.T) {
	const secret = "evil-secret-0123456789abcdef"
	url := restoreWithOwner(t, evilOwner, secret)
	escaped := printable(evilOwner)
	clean := func(what, out string) {
		t.Helper()
		if strings.ContainsAny(out, "\x1b\x07\x7f\u009b") {
			t.Errorf("%s printed a control character: %q", what, out)
		}
	}
	for _, args := range [][]string{{"describe", "jobs/x"}, {"describe", "jobs/y"}, {"sessions"}, {"top", "--once"}, {"describe", "jobs/x", "--json"}, {"sessions", "--json"}} {
		stdout, stderr, err := runMain(t, url, args...)
		if err != nil {
			t.Fatalf("lockd %s: %v (stderr %q)", strings.Join(args, " "), err, stderr)
		}
		what := "lockd " + strings.Join(args, " ")
		clean(what, stdout+stderr)
		// top clips the owner to its column; the others print it whole.
		// JSON escapes it its own way (\u001b).
		want := escaped[:12]
		if strings.HasSuffix(what, "--json") {
			want = `a\u001b]0;pwned\u0007\u001b[2J\u009b31m\u007fz`
		}
		if !strings.Contains(stdout, want) {
			t.Errorf("%s does not show the escaped owner %q:\n%s", what, want, stdout)
		}
	}

	// watch: the evil session takes and gives back a lock until the
	// watch (started from now) has printed an event of it.
	var stdout, stderr lockedBuffer
	cmd := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		if k == endpointsEnv {
			return url
		}
		return ""
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.Run(wctx, []string{"watch", "jobs/"}) }()
	svc := lockdv1connect.NewLockServiceClient(http.DefaultClient, url)
	seq := uint64(2)
	for !strings.Contains(stdout.String(), "owner=") && ctx.Err() == nil {
		seq++
		g, err := svc.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: "evil", Secret: secret, Seq: seq, Ack: seq - 1, Name: "jobs/w"}))
		if err != nil {
			t.Fatal(err)
		}
		seq++
		if _, err := svc.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: "evil", Secret: secret, Seq: seq, Ack: seq - 1, Name: "jobs/w", Token: g.Msg.Token})); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // pace the loop while the watch connects
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v (stderr %q)", err, stderr.String())
	}
	clean("lockd watch", stdout.String()+stderr.String())
	if !strings.Contains(stdout.String(), "owner="+escaped) {
		t.Errorf("lockd watch does not show the escaped owner:\n%s", stdout.String())
	}
}
