package lockdelection_test

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/k8s/lockdelection"
	"github.com/lockd-dev/lockd/lockdtest"
)

func newLock(t *testing.T, url, id string) *lockdelection.Lock {
	t.Helper()
	c, err := lockd.New(lockd.WithEndpoints(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	l, err := lockdelection.New(lockdelection.Config{Client: c, Name: "k8s/unit", Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

func rec(id string) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: id, LeaseDurationSeconds: 2}
}

// TestLockProtocol walks the calls client-go's elector makes, on a real
// in-process lockd node: no leader is NotFound; Create leads with a
// fencing token; another candidate sees the holder with a zero lease (so
// it asks lockd rather than waiting out a lease) and waits in lockd's queue
// in Update; a resign (the elector's release) hands over with a higher
// token; a Lock that lost its leadership refuses to campaign again.
func TestLockProtocol(t *testing.T) {
	srv := lockdtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := newLock(t, srv.URL(), "a")
	b := newLock(t, srv.URL(), "b")

	if _, _, err := a.Get(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("Get with no leader: %v, want NotFound", err)
	}
	if tok, fence := a.Fence(); tok != 0 || fence.Err() == nil {
		t.Fatalf("Fence before leading: %d %v", tok, fence.Err())
	}
	if err := a.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	tokA, fenceA := a.Fence()
	if tokA == 0 || fenceA.Err() != nil {
		t.Fatalf("leading a: token %d, fence %v", tokA, fenceA.Err())
	}
	r, _, err := a.Get(ctx)
	if err != nil || r.HolderIdentity != "a" || r.LeaseDurationSeconds != 2 {
		t.Fatalf("a.Get while leading: %+v %v", r, err)
	}
	if err := a.Update(ctx, rec("a")); err != nil {
		t.Fatalf("renew: %v", err)
	}
	r, _, err = b.Get(ctx)
	if err != nil || r.HolderIdentity != "a" || r.LeaseDurationSeconds != 0 {
		t.Fatalf("b.Get: %+v %v, want holder a with lease 0", r, err)
	}
	if err := b.Update(ctx, rec("a")); err == nil {
		t.Fatal("b.Update naming a: want an error")
	}
	granted := make(chan error, 1)
	go func() { granted <- b.Update(ctx, rec("b")) }()
	select {
	case err := <-granted:
		t.Fatalf("b led while a leads: %v", err)
	case <-time.After(300 * time.Millisecond): // a bound on a real server's answer: b must still wait
	}
	if err := a.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil { // the elector's release
		t.Fatalf("release: %v", err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("b after a released: %v", err)
	}
	if fenceA.Err() == nil {
		t.Error("a's fence context still live after it released")
	}
	tokB, fenceB := b.Fence()
	if tokB <= tokA || fenceB.Err() != nil {
		t.Fatalf("b's token %d after a's %d, fence %v", tokB, tokA, fenceB.Err())
	}
	err = a.Update(ctx, rec("a"))
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a campaigning again after it lost the leadership: %v", err)
	}
}
