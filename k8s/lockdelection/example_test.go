package lockdelection_test

import (
	"context"
	"os"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/k8s/lockdelection"
)

// A controller keeps its leaderelection.RunOrDie code with the lockd lock,
// and fences its writes with the leadership's token (docs/kubernetes.md).
func Example() {
	ctx := context.Background()
	c, err := lockd.New(lockd.WithEndpoints("http://lockd.locks.svc:7070"))
	if err != nil {
		panic(err)
	}
	podName, _ := os.Hostname()
	lock, err := lockdelection.New(lockdelection.Config{
		Client: c, Name: "controllers/my-controller", Identity: podName, TTL: time.Second,
	})
	if err != nil {
		panic(err)
	}
	run := func(ctx, fence context.Context, token uint64) {}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock,
		// These only pace the renew loop: lockd decides who leads.
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				token, fence := lock.Fence() // fence ends when lockd ends the leadership
				run(ctx, fence, token)       // send token with every write (docs/fencing.md)
			},
			OnStoppedLeading: func() { os.Exit(0) },
		},
	})
}
