package fsm_test

import (
	"crypto/sha256"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func hash(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// TestApplyChecksSecret: Apply refuses a session's commands that carry
// another secret hash or come from another identity, and serves the ones
// that match; the state keeps the hash and a snapshot round trip keeps it.
func TestApplyChecksSecret(t *testing.T) {
	f := initFSM(t, nil)
	c := newSession("s1")
	c.SecretHash, c.Identity = hash("good"), "alice"
	mustOK(t, f, c)
	a := acq("s1", 1, "x", fsm.ModeExclusive, false)
	for _, bad := range []struct {
		hash     []byte
		identity string
	}{{nil, "alice"}, {hash("bad"), "alice"}, {hash("good"), "mallory"}, {hash("good"), ""}} {
		a.SecretHash, a.Identity = bad.hash, bad.identity
		if r := apply(t, f, a); r.Code != fsm.CodeForbidden {
			t.Fatalf("acquire with %x/%q: %+v, want forbidden", bad.hash, bad.identity, r)
		}
		for _, m := range []proto.Message{
			&fsmv1.Release{SessionId: "s1", Seq: 2, Name: "x", Token: 1, SecretHash: bad.hash, Identity: bad.identity},
			&fsmv1.Cancel{SessionId: "s1", Seq: 3, Name: "x", AcquireSeq: 1, SecretHash: bad.hash, Identity: bad.identity},
			&fsmv1.Complete{SessionId: "s1", Seq: 4, Name: "x", Token: 1, RetentionMs: 1000, SecretHash: bad.hash, Identity: bad.identity},
			&fsmv1.CloseSession{SessionId: "s1", Seq: 5, SecretHash: bad.hash, Identity: bad.identity},
		} {
			if r := apply(t, f, m); r.Code != fsm.CodeForbidden {
				t.Fatalf("%T with %x/%q: %+v, want forbidden", m, bad.hash, bad.identity, r)
			}
		}
	}
	a.SecretHash, a.Identity = hash("good"), "alice"
	if r := mustOK(t, f, a); r.Status != fsm.StatusGranted {
		t.Fatalf("acquire with the secret: %+v", r)
	}
	snap := f.State()
	if got := snap.Sessions[0].SecretHash; string(got) != string(hash("good")) || snap.Sessions[0].Identity != "alice" {
		t.Fatalf("snapshot session: %x %q", got, snap.Sessions[0].Identity)
	}
	g := fsm.New(nil)
	if err := g.Load(snap); err != nil {
		t.Fatal(err)
	}
	if r := apply(t, g, &fsmv1.Release{SessionId: "s1", Seq: 2, Name: "x", Token: 1}); r.Code != fsm.CodeForbidden {
		t.Fatalf("release without secret after restore: %+v", r)
	}
}

// TestOldSessionAcceptsAnySecret: a session restored from a snapshot
// written before secrets (no hash, no identity) accepts any secret and
// identity, so an upgrade does not lose the sessions that live across it.
func TestOldSessionAcceptsAnySecret(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("old"))
	mustOK(t, f, acq("old", 1, "x", fsm.ModeExclusive, false))
	snap := f.State()
	if len(snap.Sessions[0].SecretHash) != 0 {
		t.Fatalf("a session created without a hash has one: %x", snap.Sessions[0].SecretHash)
	}
	b, err := fsm.EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	g := fsm.New(nil)
	if err := g.RestoreBytes(b); err != nil {
		t.Fatal(err)
	}
	mustOK(t, g, &fsmv1.Release{SessionId: "old", Seq: 2, Name: "x", Token: epoch + 1, SecretHash: hash("anything"), Identity: "bob"})
	if _, _, ok := g.SessionAuth("old"); !ok {
		t.Fatal("old session gone after a release")
	}
}

// TestSecretHashChecked: a create with a malformed hash is refused, and a
// snapshot with one is not restored.
func TestSecretHashChecked(t *testing.T) {
	f := initFSM(t, nil)
	c := newSession("s")
	c.SecretHash = []byte("short")
	if r := apply(t, f, c); r.Code != fsm.CodeInvalid {
		t.Fatalf("create with a 5-byte hash: %+v", r)
	}
	mustOK(t, f, newSession("s"))
	snap := f.State()
	snap.Sessions[0].SecretHash = []byte("short")
	if err := fsm.New(nil).Load(snap); err == nil {
		t.Fatal("snapshot with a 5-byte hash restored")
	}
}
