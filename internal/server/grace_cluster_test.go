package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/auth"
)

// TestRevokeGraceRevokesLiveHolder on a real 3-node cluster: a lock's
// policy has a 1 s revoke grace; a holder keeps its session alive and does
// not let go; an admin (authentication off: every caller) asks it to. The
// answer and DescribeLock show the grace; once it ran out the leader
// revokes the holder's session, the holder's client sees its session and
// its lock end, and only after that is the queued waiter granted (when the
// lease ran out on the server, or sooner when the holder's client, having
// given up, closed its session), with a token that fences the holder's.
func TestRevokeGraceRevokesLiveHolder(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	const grace = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := c.newClient("admin")
	if err := admin.SetLockPolicy(ctx, "deploy/db", lockd.LockPolicy{RevokeGrace: grace}); err != nil {
		t.Fatal(err)
	}
	h := newMember(t, c, "holder", "deploy/db", 5*time.Second)
	if err := h.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := make(chan time.Time, 1)
	go func() {
		<-h.m.Done()
		lost <- time.Now()
	}()
	w := newMember(t, c, "waiter", "deploy/db", 5*time.Second)
	type grant struct {
		err        error
		at         time.Time
		holderLost bool // the holder's lock had ended when the waiter got it
	}
	granted := make(chan grant, 1)
	go func() {
		err := w.m.Lock(ctx)
		g := grant{err: err, at: time.Now()}
		select {
		case <-h.m.Done():
			g.holderLost = true
		default:
		}
		granted <- g
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(describe(t, admin, "deploy/db", 5*time.Second).Waiters) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(5 * time.Millisecond)
	}

	asked := time.Now()
	r, err := admin.RequestRelease(ctx, "deploy/db", "migration")
	if err != nil {
		t.Fatal(err)
	}
	if r.Holders != 1 || r.RevokeGrace != grace {
		t.Fatalf("answer %+v, want 1 holder and the %v grace", r, grace)
	}
	hd := describe(t, admin, "deploy/db", 5*time.Second).Holders
	if len(hd) != 1 || hd[0].GetReleaseReason() != "migration" || hd[0].GetRevokeGrace().AsDuration() != grace || hd[0].GetReleaseRequestedAt() == nil {
		t.Fatalf("holder shown %v, want the request (reason, time, grace)", hd)
	}

	var holderLost time.Time
	select {
	case holderLost = <-lost:
	case <-ctx.Done():
		t.Fatal("the holder kept its lock")
	}
	g := <-granted
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	if !g.holderLost {
		t.Fatal("the waiter got the lock while the holder's client still believed it held it")
	}
	if g.at.Before(asked.Add(grace)) {
		t.Fatalf("waiter granted %v after the request, within the %v grace", g.at.Sub(asked), grace)
	}
	select {
	case <-h.s.Done():
	default:
		t.Fatal("the holder lost its lock but its session did not end")
	}
	if err := h.m.Err(); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Fatalf("holder's lock ended with %v, want ErrLeaseLost", err)
	}
	info := describe(t, admin, "deploy/db", 5*time.Second)
	if len(info.Holders) != 1 || info.Holders[0].Token != w.m.Token() || w.m.Token() <= h.m.Token() {
		t.Fatalf("holders %v, want the waiter with a token above the holder's %d", info.Holders, h.m.Token())
	}
	t.Logf("holder lost its lock %v after the request, waiter granted %v after it", holderLost.Sub(asked), g.at.Sub(asked))
}

// TestRevokeGraceSparesHolderThatLetGo: a holder asked by an admin with a
// 1 s grace releases within it and takes the lock again at once: neither
// its session nor its new hold is revoked when the old grace would have
// run out.
func TestRevokeGraceSparesHolderThatLetGo(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	const grace = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := c.newClient("admin")
	if err := admin.SetLockPolicy(ctx, "deploy/db", lockd.LockPolicy{RevokeGrace: grace}); err != nil {
		t.Fatal(err)
	}
	h := newMember(t, c, "holder", "deploy/db", 5*time.Second)
	if err := h.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	old := h.m.Token()
	if r, err := admin.RequestRelease(ctx, "deploy/db", "migration"); err != nil || r.RevokeGrace != grace {
		t.Fatalf("request: %+v %v, want the %v grace", r, err, grace)
	}
	if err := h.m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	// Three graces: the old grace's timer would have fired by then.
	select {
	case <-h.s.Done():
		t.Fatalf("the holder's session ended after it let go within its grace: %v", h.s.Err())
	case <-time.After(3 * grace):
	}
	if err := h.m.Err(); err != nil {
		t.Fatalf("the new hold ended: %v", err)
	}
	hd := describe(t, admin, "deploy/db", 5*time.Second).Holders
	if len(hd) != 1 || hd[0].Token != h.m.Token() || h.m.Token() <= old || hd[0].GetReleaseRequestedAt() != nil {
		t.Fatalf("holders %v, want the new hold, not asked", hd)
	}
	if err := h.m.Unlock(ctx); err != nil {
		t.Fatalf("unlock of the new hold: %v", err)
	}
}

// TestRevokeGraceNeedsAdmin with authentication on: a caller with lock
// permission on the lock but not admin asks its holder to let go; the hold
// records the request but gets no grace, and the answer shows none. An
// admin's request then starts the grace.
func TestRevokeGraceNeedsAdmin(t *testing.T) {
	leakCheck(t)
	opts := defaultClusterOpts()
	authFile, _ := writePeerAuth(t, t.TempDir(), "token "+auth.HashToken("billing-token")+" billing-app\ngrant billing-app lock billing/\n")
	opts.security = Security{AuthFile: authFile}
	c := newTestCluster(t, 1, opts)
	upgraded(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := c.newClient("ops", lockd.WithToken("admin-token"))
	if err := admin.SetLockPolicy(ctx, "billing/run", lockd.LockPolicy{RevokeGrace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	app := c.newClient("billing", lockd.WithToken("billing-token"))
	if err := app.SetLockPolicy(ctx, "billing/run", lockd.LockPolicy{}); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Fatalf("SetLockPolicy without admin: %v, want ErrPermissionDenied", err)
	}
	s, err := app.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.NewMutex("billing/run").TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := app.RequestRelease(ctx, "billing/run", "please")
	if err != nil {
		t.Fatal(err)
	}
	if r.Holders != 1 || r.RevokeGrace != 0 {
		t.Fatalf("non-admin request: %+v, want 1 holder and no grace", r)
	}
	hd := describe(t, admin, "billing/run", 5*time.Second).Holders
	if len(hd) != 1 || hd[0].GetReleaseReason() != "please" || hd[0].GetRevokeGrace() != nil {
		t.Fatalf("holder after a non-admin request: %v, want asked without a grace", hd)
	}
	r, err = admin.RequestRelease(ctx, "billing/run", "now")
	if err != nil || r.RevokeGrace != time.Hour {
		t.Fatalf("admin request: %+v %v, want the 1h grace", r, err)
	}
	hd = describe(t, admin, "billing/run", 5*time.Second).Holders
	if len(hd) != 1 || hd[0].GetReleaseReason() != "please" || hd[0].GetRevokeGrace().AsDuration() != time.Hour {
		t.Fatalf("holder after the admin's request: %v, want the first reason and the 1h grace", hd)
	}
	if err := admin.SetLockPolicy(ctx, "billing/run", lockd.LockPolicy{RevokeGrace: 500 * time.Millisecond}); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("a 500ms grace: %v, want ErrInvalidArgument", err)
	}
}
