package redislock_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/redislock"
	"github.com/lockd-dev/lockd/redislock/redistest"
)

// exampleAddr is the address of the redis-server the examples run
// against, started by TestMain.
var exampleAddr string

// startExampleServer starts the examples' redis-server and returns what
// stops it. Without redis-server the examples are skipped (an example
// cannot skip itself), except under CI=true, where they run and fail.
func startExampleServer() (stop func()) {
	srv, err := redistest.Launch()
	if errors.Is(err, redistest.ErrNotInstalled) && os.Getenv("CI") != "true" {
		fmt.Fprintf(os.Stderr, "%v: skipping the examples\n", err)
		_ = flag.Set("test.skip", "^Example")
		return func() {}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "examples: %v\n", err)
		return func() {}
	}
	exampleAddr = srv.Addr()
	return srv.Stop
}

// Two copies of a job race for the month's invoices on one Redis: one
// gets the lock and its fencing token, the other sees lockd.ErrBusy and
// leaves the work to it, as with lockd's own client.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	copyA, err := redislock.New(ctx, rdb, redislock.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer copyA.Close(context.Background())
	copyB, err := redislock.New(ctx, rdb, redislock.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer copyB.Close(context.Background())

	a := copyA.NewMutex("invoices/2026-11")
	if err := a.TryLock(ctx); err != nil {
		fmt.Println("copy A:", err)
		return
	}
	fmt.Println("copy A holds the lock, token > 0:", a.Token() > 0)

	b := copyB.NewMutex("invoices/2026-11")
	err = b.TryLock(ctx)
	fmt.Println("copy B busy:", errors.Is(err, lockd.ErrBusy))

	if err := a.Unlock(ctx); err != nil {
		fmt.Println("unlock:", err)
		return
	}
	if err := b.TryLock(ctx); err != nil {
		fmt.Println("copy B:", err)
		return
	}
	fmt.Println("after A's release, B holds it with a larger token:", b.Token() > a.Token())
	_ = b.Unlock(ctx)
	// Output:
	// copy A holds the lock, token > 0: true
	// copy B busy: true
	// after A's release, B holds it with a larger token: true
}
