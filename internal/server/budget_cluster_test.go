package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestHoldBudgetEndsLiveHolderAcrossLeaderKill: a holder whose session
// stays alive (keepalives flow) but who keeps the lock past its max_hold
// loses it: its own client reports the hold over (the lock's context ends
// with ErrHoldExpired) before the leader grants the lock to the waiter,
// with the leader killed while the budget runs. The grant time is the
// leader's (the EndHold proposal's wall clock, in the holder's GrantedAt),
// the end time the holder's client's; one process, one clock. The session
// lives on, and the waiter's token fences the old one.
func TestHoldBudgetEndsLiveHolderAcrossLeaderKill(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	const (
		ttl    = 10 * time.Second // well past the budget, and keepalives on a busy machine
		budget = 3 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	h := newMember(t, c, "holder", "job", ttl)
	h.m = h.s.NewMutex("job", lockd.WithMaxHold(budget))
	sent := time.Now()
	if err := h.m.TryLock(ctx); err != nil {
		t.Fatalf("holder: %v", err)
	}
	h.token = h.m.Token()
	dl := h.m.Deadline()
	if dl.IsZero() || dl.After(sent.Add(budget)) || !dl.Before(h.s.Deadline().Add(time.Hour)) {
		t.Fatalf("holder deadline %v: want at most sent+%v = %v", dl, budget, sent.Add(budget))
	}
	over := make(chan time.Time, 1)
	go func() {
		<-h.m.Done()
		over <- time.Now()
	}()

	w := newMember(t, c, "waiter", "job", ttl)
	granted := make(chan error, 1)
	go func() { granted <- w.m.Lock(ctx) }()
	obs := c.newClient("observer")
	deadline := time.Now().Add(10 * time.Second)
	for len(describe(t, obs, "job", 5*time.Second).Waiters) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Kill the leader while the budget runs: the new leader restarts the
	// budget in full, so the hold ends later, never earlier.
	li, err := c.waitLeader(15 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.stop(li, true)
	if _, err := c.waitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}

	if err := <-granted; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	holderOver := <-over
	if cause := context.Cause(h.m.Context()); !errors.Is(cause, lockd.ErrHoldExpired) {
		t.Fatalf("holder's context ended with %v, want ErrHoldExpired", cause)
	}
	info := describe(t, obs, "job", 5*time.Second)
	if len(info.Holders) != 1 || info.Holders[0].Token != w.m.Token() {
		t.Fatalf("holders %v, want the waiter with token %d", info.Holders, w.m.Token())
	}
	grantAt := info.Holders[0].GrantedAt.AsTime()
	if !holderOver.Before(grantAt) {
		t.Fatalf("holder's client reported the hold over at %v, after the leader granted the waiter at %v", holderOver, grantAt)
	}
	if w.m.Token() <= h.token {
		t.Fatalf("waiter's token %d does not fence the holder's %d", w.m.Token(), h.token)
	}
	if err := h.s.Err(); err != nil {
		t.Fatalf("the holder's session ended too: %v", err)
	}
	if err := h.m.Unlock(ctx); !errors.Is(err, lockd.ErrHoldExpired) {
		t.Fatalf("holder's Unlock after its budget: %v, want ErrHoldExpired", err)
	}
	t.Logf("holder's client gave up %v before the grant to the waiter; hold lasted %v (budget %v, leader killed)",
		grantAt.Sub(holderOver), grantAt.Sub(sent), budget)
}

// TestLockPolicyDefaultBudget: a lock policy gives a hold its budget when
// the acquire asks none; the answer, DescribeLock's holder and its policy
// show it; an acquire's own max_hold wins; removing the policy removes the
// default; bad durations are refused without a log entry.
func TestLockPolicyDefaultBudget(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 1, defaultClusterOpts())
	upgraded(t, c)
	cl := c.newClient("admin")
	svc := cl.Service()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set := func(d time.Duration) error {
		req := &lockdv1.SetLockPolicyRequest{Name: "p"}
		if d != 0 {
			req.Policy = &lockdv1.LockPolicy{DefaultMaxHold: durationpb.New(d)}
		}
		_, err := svc.SetLockPolicy(ctx, connect.NewRequest(req))
		return err
	}
	if err := set(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := set(-time.Second); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("negative default: %v", err)
	}
	if err := set(721 * time.Hour); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("default above 720h: %v", err)
	}
	s, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMutex("p")
	sent := time.Now()
	if err := m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	// The hold's own end (its context's deadline); Deadline is the
	// earlier of it and the 5 s lease.
	if dl, ok := m.Context().Deadline(); !ok || dl.After(sent.Add(time.Minute)) || !dl.After(sent.Add(time.Minute/2)) {
		t.Fatalf("hold deadline %v %v with the policy's 1m budget (sent %v)", dl, ok, sent)
	}
	if !m.Deadline().Equal(s.Deadline()) && m.Deadline().After(s.Deadline()) {
		t.Fatalf("Deadline %v after the lease's %v", m.Deadline(), s.Deadline())
	}
	resp, err := svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "p"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.GetPolicy().GetDefaultMaxHold().AsDuration(); got != time.Minute {
		t.Fatalf("policy shown: %v", resp.Msg.GetPolicy())
	}
	if got := resp.Msg.GetLock().GetHolders()[0].GetMaxHold().AsDuration(); got != time.Minute {
		t.Fatalf("holder's budget shown: %v", got)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The acquire's own budget beats the default.
	m2 := s.NewMutex("p", lockd.WithMaxHold(10*time.Second))
	if err := m2.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if dl, ok := m2.Context().Deadline(); !ok || dl.After(time.Now().Add(10*time.Second)) {
		t.Fatalf("hold deadline %v %v beyond the asked 10s", dl, ok)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := set(0); err != nil {
		t.Fatal(err)
	}
	resp, err = svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "p"}))
	if err != nil || resp.Msg.Policy != nil {
		t.Fatalf("after removal: %v %v", resp, err)
	}
	m3 := s.NewMutex("p")
	if err := m3.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if dl, ok := m3.Context().Deadline(); ok {
		t.Fatalf("without a budget the hold has no deadline of its own: %v", dl)
	}
}
