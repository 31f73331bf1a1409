package lockdelection_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestLeaseDefaultsFailover is the side-by-side baseline for
// TestFailoverKill9: client-go's own LeaseLock with its documented defaults
// (LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s), three
// candidates, the leader stopped ten times without releasing the Lease (as
// a kill -9 would), and the time until the next candidate starts leading.
// No API server runs here, so the Lease lives in client-go's fake
// clientset (a fake for a part this machine cannot run), and the elector's
// timers run in virtual time (testing/synctest): the numbers are the
// algorithm's timing, without a real API server's latency.
func TestLeaseDefaultsFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		type started struct {
			id string
			t  time.Time
		}
		events := make(chan started, 16)
		cancels := map[string]context.CancelFunc{}
		next := 0
		spawn := func() {
			id := fmt.Sprintf("cand-%d", next)
			next++
			ctx, cancel := context.WithCancel(context.Background())
			cancels[id] = cancel
			lock := &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Name: "demo", Namespace: "default"},
				Client:     cs.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: id},
			}
			go leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock:          lock,
				LeaseDuration: 15 * time.Second,
				RenewDeadline: 10 * time.Second,
				RetryPeriod:   2 * time.Second,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(ctx context.Context) {
						events <- started{id, time.Now()}
						<-ctx.Done()
					},
					OnStoppedLeading: func() {},
				},
			})
		}
		for range 3 {
			spawn()
		}
		cur := <-events
		var failovers []time.Duration
		for range 10 {
			killed := time.Now()
			cancels[cur.id]() // stops renewing; ReleaseOnCancel is off: the Lease stays
			delete(cancels, cur.id)
			spawn()
			nl := <-events
			if nl.id == cur.id {
				t.Fatalf("stopped candidate %s leads again", cur.id)
			}
			failovers = append(failovers, nl.t.Sub(killed))
			cur = nl
		}
		for _, c := range cancels {
			c()
		}
		sorted := slices.Clone(failovers)
		slices.Sort(sorted)
		fmt.Printf("client-go LeaseLock defaults (15s/10s/2s, fake clientset, virtual time), 10 stops: p50 %v max %v all %v\n",
			sorted[len(sorted)/2], sorted[len(sorted)-1], failovers)
		// The Lease must be waited out: a candidate never takes over
		// before LeaseDuration has passed since it saw the last renewal.
		if sorted[0] < 13*time.Second {
			t.Errorf("a Lease candidate took over after %v, before the lease ran out", sorted[0])
		}
	})
}
