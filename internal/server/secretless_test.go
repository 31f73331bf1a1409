package server

import (
	"bytes"
	"context"
	"errors"
	lockdapi "github.com/lockd-dev/lockd/internal/api"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// lockedBuffer is an io.Writer whose contents can be read while it is
// written.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns what was written so far.
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waiterSecret is the secret of the sessions these tests create with one.
const waiterSecret = "waiter-secret-0123456789abcdef"

// testSecretHash is the secret hash of sessions tests create by proposing
// CreateSession themselves: a session without one is revoked by the next
// leader (a restart, a restore, a leader change), as one restored from a
// backup written before session secrets.
var testSecretHash = lockdapi.HashSecret(waiterSecret)

// TestRestoreRevokesSecretlessSession: a backup written
// before session secrets restores a session without a secret hash, which
// Apply lets anyone use with any secret. The restored cluster's leader
// revokes it: KeepAlive and Release on its id are refused with any secret,
// a warning names it, and it expires after its TTL and grace in full —
// never earlier, since its holder may still run under a lease an earlier
// leader granted — when its hold goes to the waiter and a hold with a
// lock-delay stays delayed, as after any expiry.
//
// The backup is a real node's GET /v1/snapshot. Its secretless session is
// made by a CreateSession command without secret_hash, as a node from
// before session secrets proposed it, so the snapshot holds the session
// exactly as such a node's snapshot does (the secret_hash field absent);
// the source node runs no revocation for it (its leadership began before
// the session existed).
func TestRestoreRevokesSecretlessSession(t *testing.T) {
	src := startServer(t, testConfig(t.TempDir()))
	defer src.Close()
	const oldTTL = 2 * time.Second
	propose(t, src, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "old", TtlMs: oldTTL.Milliseconds(), Owner: "old-owner"})
	propose(t, src, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "old", Seq: 1, Name: "jobs/x", Mode: fsm.ModeExclusive})
	propose(t, src, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "old", Seq: 2, Ack: 1, Name: "jobs/delayed", Mode: fsm.ModeExclusive, LockDelayMs: 3600_000})
	hash := lockdapi.HashSecret(waiterSecret)
	propose(t, src, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "waiter", TtlMs: 3600_000, Owner: "waiter", SecretHash: hash})
	if r := propose(t, src, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "waiter", Seq: 1, Name: "jobs/x", Mode: fsm.ModeExclusive, Wait: true, SecretHash: hash}); r.Status != fsm.StatusQueued {
		t.Fatalf("waiter's acquire: status %v, want queued", r.Status)
	}
	if secretHash, _, ok := src.fsm.SessionAuth("old"); !ok || len(secretHash) != 0 {
		t.Fatal("the source cluster has no secretless session to back up")
	}
	file := downloadBackup(t, src)
	src.Close()

	cfg := testConfig(t.TempDir())
	cfg.Restore = file
	logs := &lockedBuffer{}
	start := time.Now() // before the restored node's leadership began
	s, err := New(cfg, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctxWait(t, s)
	c := lockdv1connect.NewLockServiceClient(http.DefaultClient, s.URL())
	ctx := t.Context()
	// Revoked while it lives: a KeepAlive with any secret is refused (on a
	// node without the fix, it is served and the session lives on).
	if _, ok := s.fsm.Session("old"); ok {
		if _, err := c.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: "old", Secret: "any-secret-any-secret-0123456789"})); err == nil {
			t.Fatal("KeepAlive of the revoked session was served")
		}
	}
	// It expires at the leader's timer: poll (a real node) with a generous
	// deadline.
	for deadline := time.Now().Add(10*time.Second + oldTTL); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := s.fsm.Session("old"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restored secretless session is still there 10s after its TTL")
		}
	}
	// Never before its TTL and grace from the leadership's start (a lower
	// bound: a busy machine only makes it later).
	if took := time.Since(start); took < oldTTL+cfg.Grace {
		t.Fatalf("the secretless session expired %v after the restore began, before its TTL %v and grace", took, oldTTL)
	}
	if l, ok := s.fsm.Describe("jobs/x"); !ok || len(l.Holders) != 1 || l.Holders[0].Session != "waiter" {
		t.Fatalf("jobs/x after the revocation: %+v, want held by the waiter", l)
	}
	if l, ok := s.fsm.Describe("jobs/delayed"); !ok || !l.Delayed {
		t.Fatalf("jobs/delayed after the revocation: %+v, want delayed as after an expiry", l)
	}
	if _, ok := s.fsm.Session("waiter"); !ok {
		t.Fatal("the waiter's session (it has a secret) was revoked too")
	}

	for _, secret := range []string{"", "any-secret-any-secret-0123456789"} {
		if _, err := c.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: "old", Secret: secret})); err == nil {
			t.Fatalf("KeepAlive of the revoked session with secret %q was served", secret)
		}
		if _, err := c.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: "old", Secret: secret, Seq: 3, Ack: 2, Name: "jobs/x", Token: 1})); err == nil {
			t.Fatalf("Release on the revoked session with secret %q was served", secret)
		}
	}
	out := logs.String()
	var line string
	for l := range strings.Lines(out) {
		if strings.Contains(l, "session without a secret revoked") {
			line = l
		}
	}
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "session=old") || !strings.Contains(line, "owner=old-owner") {
		t.Fatalf("no warning naming the revoked session and its owner; log:\n%s", out)
	}
}

// TestSecretlessSessionRefusedByHandlers: until the
// leader's expiry of a secretless session commits, the handlers refuse
// every session-scoped call on it with any secret, before proposing:
// KeepAlive (unary and on the session stream's batch), Acquire, Release,
// Cancel, Complete, SetValue, CloseSession, and a CreateSession retry that
// names its request id. The session is made on a leader already
// established (so its revocation does not run), by a CreateSession without
// secret_hash as a node before session secrets proposed it.
func TestSecretlessSessionRefusedByHandlers(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "old", RequestId: "old-request", TtlMs: 3600_000})
	g := propose(t, s, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "old", Seq: 1, Name: "jobs/x", Mode: fsm.ModeExclusive})
	c := lockdv1connect.NewLockServiceClient(http.DefaultClient, s.URL())
	ctx := t.Context()
	const secret = "any-secret-any-secret-0123456789"
	calls := map[string]func() error{
		"keepalive": func() error {
			_, err := c.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: "old", Secret: secret}))
			return err
		},
		"acquire": func() error {
			_, err := c.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: "old", Secret: secret, Seq: 2, Ack: 1, Name: "jobs/y"}))
			return err
		},
		"release": func() error {
			_, err := c.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: "old", Secret: secret, Seq: 3, Ack: 1, Name: "jobs/x", Token: g.Token}))
			return err
		},
		"cancel": func() error {
			_, err := c.Cancel(ctx, connect.NewRequest(&lockdv1.CancelRequest{SessionId: "old", Secret: secret, Seq: 4, Ack: 1, Name: "jobs/x", AcquireSeq: 1}))
			return err
		},
		"complete": func() error {
			_, err := c.Complete(ctx, connect.NewRequest(&lockdv1.CompleteRequest{SessionId: "old", Secret: secret, Seq: 5, Ack: 1, Name: "jobs/x", Token: g.Token, Retention: durationpb.New(400 * 24 * time.Hour)}))
			return err
		},
		"setvalue": func() error {
			_, err := c.SetValue(ctx, connect.NewRequest(&lockdv1.SetValueRequest{SessionId: "old", Secret: secret, Seq: 6, Ack: 1, Name: "jobs/x", Token: g.Token, Value: []byte("mine")}))
			return err
		},
		"close": func() error {
			_, err := c.CloseSession(ctx, connect.NewRequest(&lockdv1.CloseSessionRequest{SessionId: "old", Secret: secret, Seq: 7}))
			return err
		},
		"create-retry": func() error {
			_, err := c.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{RequestId: "old-request", Secret: secret}))
			return err
		},
		"stream-keepalive": func() error { return streamKeepAlive(ctx, s, "old", secret) },
	}
	for name, call := range calls {
		err := call()
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "no secret") {
			t.Errorf("%s on a secretless session: %v, want PermissionDenied saying it has no secret", name, err)
		}
	}
	if l, ok := s.fsm.Describe("jobs/x"); !ok || len(l.Holders) != 1 || l.Holders[0].Session != "old" || l.Mark != nil {
		t.Fatalf("jobs/x changed: %+v", l)
	}
	if _, ok := s.fsm.Describe("jobs/y"); ok {
		t.Fatal("an Acquire on the secretless session was proposed")
	}
}

// streamKeepAlive renews session id by the session stream's batch handler
// (keepAliveBatch, called directly) and returns its error.
func streamKeepAlive(ctx context.Context, s *Server, id, secret string) error {
	resp, err := s.api.Hooks().KeepAliveBatch(ctx, &lockdv1.KeepAliveBatch{Sessions: []*lockdv1.KeepAliveRequest{{SessionId: id, Secret: secret}}}, time.Now())
	if err != nil {
		return err
	}
	if e := resp.Results[0].Error; e != nil {
		return connect.NewError(connect.Code(e.Code), errors.New(e.Message))
	}
	return nil
}
