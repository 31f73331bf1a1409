package lockd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// An observer sees the leader now (none), then every change in order: a
// leader, its proclaimed value, the next leader after a resign (a higher
// token), and no leader when that one's session ends. Proclaim by a
// non-leader is refused.
func TestElectionObserveProclaim(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s1, s2 := newSession(t, c), newSession(t, c)
	e1, e2 := s1.NewElection("elect/x"), s2.NewElection("elect/x")

	seen := make(chan lockd.Leader, 10)
	go func() {
		defer close(seen)
		for l, err := range c.ObserveElection(ctx, "elect/x") {
			if err != nil {
				return
			}
			seen <- l
		}
	}()
	next := func() lockd.Leader {
		t.Helper()
		select {
		case l := <-seen:
			return l
		case <-ctx.Done():
			t.Fatal("no leader change observed")
		}
		return lockd.Leader{}
	}
	str := func(l lockd.Leader) string { return fmt.Sprintf("%s %q %d", l.SessionID, l.Value, l.Token) }
	if l := next(); l.Token != 0 {
		t.Fatalf("first: %s, want no leader", str(l))
	}
	if err := e1.Proclaim(ctx, []byte("x")); !errors.Is(err, lockd.ErrNotHeld) {
		t.Fatalf("proclaim before leading: %v, want ErrNotHeld", err)
	}
	if err := e1.Campaign(ctx, []byte("one")); err != nil {
		t.Fatal(err)
	}
	want := []lockd.Leader{{SessionID: s1.ID(), Value: []byte("one"), Token: e1.Token()}}
	if err := e1.Proclaim(ctx, []byte("one, again")); err != nil {
		t.Fatal(err)
	}
	if l, err := e1.Leader(ctx); err != nil || string(l.Value) != "one, again" || l.Token != e1.Token() {
		t.Fatalf("leader after proclaim: %s %v", str(l), err)
	}
	if e1.Err() != nil {
		t.Fatalf("leadership after proclaim: %v", e1.Err())
	}
	want = append(want, lockd.Leader{SessionID: s1.ID(), Value: []byte("one, again"), Token: e1.Token()})
	campaign := make(chan error, 1)
	go func() { campaign <- e2.Campaign(ctx, []byte("two")) }()
	// e2 queues behind e1 (its Leader would still be e1).
	for {
		d, err := c.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "elect/x"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Msg.GetLock().GetWaiters()) == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e1.Proclaim(ctx, nil); err != nil { // an empty value is a value
		t.Fatal(err)
	}
	want = append(want, lockd.Leader{SessionID: s1.ID(), Token: e1.Token()})
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-campaign; err != nil {
		t.Fatal(err)
	}
	want = append(want, lockd.Leader{SessionID: s2.ID(), Value: []byte("two"), Token: e2.Token()})
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want = append(want, lockd.Leader{})
	var got []lockd.Leader
	for range want {
		got = append(got, next())
	}
	if !slices.EqualFunc(got, want, func(a, b lockd.Leader) bool { return str(a) == str(b) }) {
		var g, w []string
		for i := range got {
			g, w = append(g, str(got[i])), append(w, str(want[i]))
		}
		t.Fatalf("observed:\n%q\nwant:\n%q", g, w)
	}
	if want[3].Token <= want[0].Token {
		t.Fatalf("the second leader's token %d is not above the first's %d", want[3].Token, want[0].Token)
	}
}
