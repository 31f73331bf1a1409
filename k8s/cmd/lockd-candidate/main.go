// Command lockd-candidate is a leader-election candidate for the failover
// test: client-go's leaderelection.RunOrDie with the lockd-backed lock. It
// prints one JSON line on stdout when it starts leading (identity, fencing
// token, time) and leads until killed.
//
//	lockd-candidate -endpoints http://127.0.0.1:7001,... -name k8s/demo -id a
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/k8s/lockdelection"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lockd-candidate:", err)
		os.Exit(1)
	}
}

func run() error {
	endpoints := flag.String("endpoints", "", "comma-separated lockd API URLs")
	name := flag.String("name", "k8s/demo", "election name")
	id := flag.String("id", "", "this candidate's identity")
	ttl := flag.Duration("ttl", time.Second, "lockd session TTL")
	flag.Parse()
	if *endpoints == "" || *id == "" {
		return fmt.Errorf("-endpoints and -id are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := lockd.New(lockd.WithEndpoints(strings.Split(*endpoints, ",")...))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	lock, err := lockdelection.New(lockdelection.Config{Client: c, Name: *name, Identity: *id, TTL: *ttl})
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock,
		// These pace the renew loop only; lockd decides who leads.
		LeaseDuration:   2 * time.Second,
		RenewDeadline:   time.Second,
		RetryPeriod:     200 * time.Millisecond,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				token, fence := lock.Fence()
				_ = out.Encode(map[string]any{"event": "leading", "id": *id, "token": token, "t": time.Now().UnixNano()})
				select {
				case <-ctx.Done():
				case <-fence.Done():
				}
			},
			OnStoppedLeading: func() {
				_ = out.Encode(map[string]any{"event": "stopped", "id": *id, "t": time.Now().UnixNano()})
			},
		},
	})
	return nil
}
