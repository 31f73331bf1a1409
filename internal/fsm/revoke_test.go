package fsm_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// releaseAsks records the release-request events: session, token, reason,
// and the revoke grace the leader's timer would start (grace=ms).
type releaseAsks struct{ lines []string }

func (r *releaseAsks) Events(_ uint64, evs []fsm.Event) {
	for _, e := range evs {
		switch e.Kind {
		case fsm.EventReleaseAsked:
			r.lines = append(r.lines, fmt.Sprintf("%s %d %s grace=%d", e.Session, e.Token, e.Value, e.DurationMs))
		case fsm.EventSessionRevoked:
			r.lines = append(r.lines, "revoked "+e.Session)
		}
	}
}
func (r *releaseAsks) Reset(uint64) {}

func (r *releaseAsks) take() []string {
	l := r.lines
	r.lines = nil
	return l
}

// TestRequestRelease: one event per hold (session, token, the reason as
// value), in token order, every time; each hold records its first request
// only, which ReleaseAsks and the lock's view show; a long reason is
// refused; a free lock is left alone.
func TestRequestRelease(t *testing.T) {
	rec := &releaseAsks{}
	f := initFSM(t, rec)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	t1 := mustOK(t, f, acqLimit("s1", 1, "sem", shrd, false, 0)).Token
	t2 := mustOK(t, f, acqLimit("s2", 1, "sem", shrd, false, 0)).Token
	r := mustOK(t, f, &fsmv1.RequestRelease{Name: "sem", Reason: "deploy", TimeUnixNano: 5})
	if len(r.Holders) != 2 || r.Holders[0].ReleaseReason != "deploy" || r.Holders[1].ReleaseRequestedAt.UnixNano() != 5 {
		t.Fatalf("answer %+v", r)
	}
	want := []string{fmt.Sprintf("s1 %d deploy grace=0", t1), fmt.Sprintf("s2 %d deploy grace=0", t2)}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	mustOK(t, f, &fsmv1.RequestRelease{Name: "sem", Reason: "again", TimeUnixNano: 9})
	if got := rec.take(); len(got) != 2 || !strings.Contains(got[0], "again") {
		t.Fatalf("second request's events %q", got)
	}
	asks := f.ReleaseAsks("s1")
	if len(asks) != 1 || asks[0].Name != "sem" || asks[0].Token != t1 || asks[0].Reason != "deploy" || asks[0].At.UnixNano() != 5 || asks[0].Grace != 0 {
		t.Fatalf("ReleaseAsks: %+v", asks)
	}
	if r := apply(t, f, &fsmv1.RequestRelease{Name: "sem", Reason: strings.Repeat("x", fsm.MaxReasonBytes+1)}); r.Code != fsm.CodeInvalid {
		t.Fatalf("long reason: %+v", r)
	}
	if r := mustOK(t, f, &fsmv1.RequestRelease{Name: "free"}); len(r.Holders) != 0 {
		t.Fatalf("free lock: %+v", r)
	}
	// A new grant is not asked: the request was for the hold, not the name.
	mustOK(t, f, rel("s1", 2, "sem", t1))
	mustOK(t, f, acqLimit("s1", 3, "sem", shrd, false, 0))
	if asks := f.ReleaseAsks("s1"); len(asks) != 0 {
		t.Fatalf("a new hold carries an old request: %+v", asks)
	}
}

// TestRevokeGrace: only an admin's request on a lock whose policy has a
// revoke grace sets the grace, once per hold (the event carries it for the
// leader's timer; a repeat does not restart it); RevokeHold revokes the
// session of that very hold only, and a stale one is refused.
func TestRevokeGrace(t *testing.T) {
	rec := &releaseAsks{}
	f := initFSM(t, rec)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "job", RevokeGraceMs: 2000})
	tok := mustOK(t, f, acq("s1", 1, "job", excl, false)).Token
	mustOK(t, f, acq("s2", 1, "job", excl, true))
	rec.take()
	mustOK(t, f, &fsmv1.RequestRelease{Name: "job", Reason: "waiter", TimeUnixNano: 5})
	if got := rec.take(); !slices.Equal(got, []string{fmt.Sprintf("s1 %d waiter grace=0", tok)}) {
		t.Fatalf("a waiter's request: %q", got)
	}
	r := mustOK(t, f, &fsmv1.RequestRelease{Name: "job", Reason: "admin", Admin: true, TimeUnixNano: 77})
	if r.MaxHold != 2*time.Second {
		t.Fatalf("admin's answer %+v", r)
	}
	mustOK(t, f, &fsmv1.RequestRelease{Name: "job", Reason: "admin again", Admin: true})
	if got, want := rec.take(), []string{fmt.Sprintf("s1 %d admin grace=2000", tok), fmt.Sprintf("s1 %d admin again grace=0", tok)}; !slices.Equal(got, want) {
		t.Fatalf("admin's requests: %q, want %q", got, want)
	}
	// The first request's time and reason stay; the grace counts from the
	// admin's request.
	if asks := f.ReleaseAsks("s1"); len(asks) != 1 || asks[0].At.UnixNano() != 5 || asks[0].Reason != "waiter" || asks[0].GraceFrom.UnixNano() != 77 || asks[0].Grace != 2*time.Second {
		t.Fatalf("ReleaseAsks: %+v", asks)
	}
	var graces []fsm.Budget
	f.WithRevokeGraces(func(bs []fsm.Budget) { graces = bs })
	if len(graces) != 1 || graces[0].Token != tok || graces[0].MaxHold != 2*time.Second {
		t.Fatalf("WithRevokeGraces: %+v", graces)
	}
	// Not this hold: nothing happens.
	mustOK(t, f, &fsmv1.RevokeHold{Name: "job", SessionId: "s2", Token: tok})
	mustOK(t, f, &fsmv1.RevokeHold{Name: "job", SessionId: "s1", Token: tok + 1})
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("a RevokeHold of another hold: %q", got)
	}
	data := cmd(t, &fsmv1.RevokeHold{Name: "job", SessionId: "s1", Token: tok, Term: 2})
	if r := f.Apply(raftLog(3, 100, data)).(*fsm.Result); r.Code != fsm.CodeInvalid {
		t.Fatalf("stale RevokeHold: %+v", r)
	}
	if r := f.Apply(raftLog(2, 101, data)).(*fsm.Result); r.Code != fsm.OK || r.GrantedAt.IsZero() {
		t.Fatalf("RevokeHold: %+v", r)
	}
	if got := rec.take(); !slices.Equal(got, []string{"revoked s1"}) {
		t.Fatalf("RevokeHold's events %q", got)
	}
	// Revoked, not stolen: s1 still holds until its lease runs out.
	if l, ok := f.Describe("job"); !ok || len(l.Holders) != 1 || l.Holders[0].Session != "s1" {
		t.Fatalf("after RevokeHold: %+v", l)
	}
	for _, p := range []*fsmv1.SetLockPolicy{{Name: "a", RevokeGraceMs: 999}, {Name: "a", RevokeGraceMs: fsm.MaxRevokeGraceMs + 1}, {Name: "a", RevokeGraceMs: -1}} {
		if r := apply(t, f, p); r.Code != fsm.CodeInvalid {
			t.Errorf("SetLockPolicy %v: %+v", p, r)
		}
	}
}

// TestRequestReleaseSnapshot: holds' requests and policies' graces survive
// a snapshot byte for byte; a snapshot with request fields but no request,
// or a grace out of range, is refused.
func TestRequestReleaseSnapshot(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "a", RevokeGraceMs: 1500})
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, acq("s1", 2, "b", excl, false))
	mustOK(t, f, &fsmv1.RequestRelease{Name: "a", Reason: "r", Admin: true})
	mustOK(t, f, &fsmv1.RequestRelease{Name: "b"}) // time 0, no reason: still asked
	g := fsm.New(nil)
	if err := g.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	if a, b := f.State().String(), g.State().String(); a != b {
		t.Fatalf("restored state differs:\n%v\n%v", b, a)
	}
	if asks := g.ReleaseAsks("s1"); len(asks) != 2 || asks[0].Grace != 1500*time.Millisecond || asks[1].Name != "b" {
		t.Fatalf("restored asks %+v", asks)
	}
	for name, mutate := range map[string]func(s *fsmv1.Snapshot){
		"reason without request": func(s *fsmv1.Snapshot) { s.Locks[0].Holders[0].Asked = false },
		"grace out of range":     func(s *fsmv1.Snapshot) { s.Locks[0].Holders[0].RevokeGraceMs = 5 },
		"grace start, no grace":  func(s *fsmv1.Snapshot) { s.Locks[1].Holders[0].GraceUnixNano = 3 },
		"policy grace":           func(s *fsmv1.Snapshot) { s.Policies[0].RevokeGraceMs = -1 },
	} {
		s := f.State()
		mutate(s)
		if err := fsm.New(nil).Load(s); err == nil {
			t.Errorf("%s: snapshot loaded", name)
		}
	}
}
