package lockd_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
)

// Eight billing servers run the same cron job on the first of the month;
// the invoices must go out once. Each copy asks lockd first, and only the
// one that gets the lock sends them.
func Example() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())

	// Two of the servers, each with its own session (its lease).
	billing1, err := client.NewSession(ctx, lockd.WithOwner("billing-1"))
	if err != nil {
		log.Fatal(err)
	}
	billing2, err := client.NewSession(ctx, lockd.WithOwner("billing-2"))
	if err != nil {
		log.Fatal(err)
	}

	first := billing1.NewMutex("invoices/2025-01")
	if err := first.TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("billing-1: sending January invoices")

	second := billing2.NewMutex("invoices/2025-01")
	var busy *lockd.BusyError
	if err := second.TryLock(ctx); errors.As(err, &busy) {
		fmt.Printf("billing-2: skipped, %s is sending them\n", busy.Holders[0].Owner)
	}

	if err := first.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("billing-1: done")
	// Output:
	// billing-1: sending January invoices
	// billing-2: skipped, billing-1 is sending them
	// billing-1: done
}

// A worker that would rather wait its turn than skip the job calls Lock: it
// queues on the server and is woken when the lock is free. The context
// bounds the wait; when it ends, Lock leaves the queue.
func ExampleMutex_Lock() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	session, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close(ctx)

	mu := session.NewMutex("invoices/2025-02")
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := mu.Lock(waitCtx); errors.Is(err, context.DeadlineExceeded) {
		fmt.Println("gave up waiting")
		return
	} else if err != nil {
		log.Fatal(err)
	}
	defer mu.Unlock(ctx)
	fmt.Println("sending February invoices")
	// Output: sending February invoices
}

// The invoice run does its work under the lock's Context: if the session's
// lease is lost (a network partition, a long pause), the context is
// cancelled before any other server can be granted the lock, and the run
// stops instead of sending invoices twice.
func ExampleMutex_Context() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	session, err := client.NewSession(ctx, lockd.WithTTL(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close(ctx)

	mu := session.NewMutex("invoices/2025-03")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	work := mu.Context()
	for _, customer := range []string{"acme", "globex", "initech"} {
		if err := work.Err(); err != nil {
			fmt.Println("stopping:", context.Cause(work))
			return
		}
		fmt.Println("invoice sent to", customer)
	}
	if err := mu.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after Unlock:", mu.Err())
	// Output:
	// invoice sent to acme
	// invoice sent to globex
	// invoice sent to initech
	// after Unlock: lockd: lock not held
}

// invoiceTable stands for the database the invoices are written to. It
// remembers the highest fencing token it has seen and refuses older ones.
type invoiceTable struct {
	mu        sync.Mutex
	lastToken uint64
}

func (t *invoiceTable) write(token uint64, invoice string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if token < t.lastToken {
		return fmt.Errorf("stale fencing token: refused %s", invoice)
	}
	t.lastToken = token
	return nil
}

// A lease cannot stop a holder that was paused and wakes up after others
// took the lock. Fencing tokens can: every grant's token is larger than
// every earlier one, so the invoice table refuses the late writer.
func ExampleMutex_Token() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	table := &invoiceTable{}

	// billing-1 takes the lock, then freezes (a long GC pause)...
	billing1, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	old := billing1.NewMutex("invoices/2025-04")
	if err := old.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	staleToken := old.Token()
	billing1.Close(ctx) // ...its lease ends meanwhile.

	// billing-2 gets the lock and writes with its newer token.
	billing2, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer billing2.Close(ctx)
	mu := billing2.NewMutex("invoices/2025-04")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("billing-2:", table.write(mu.Token(), "INV-1001"))

	// billing-1 wakes up and tries to write with its old token.
	fmt.Println("billing-1:", table.write(staleToken, "INV-1001"))
	// Output:
	// billing-2: <nil>
	// billing-1: stale fencing token: refused INV-1001
}

// Month-end reports are heavy: at most two run at once, whichever servers
// start them.
func ExampleSemaphore() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())

	for _, server := range []string{"reports-1", "reports-2", "reports-3"} {
		session, err := client.NewSession(ctx, lockd.WithOwner(server))
		if err != nil {
			log.Fatal(err)
		}
		defer session.Close(ctx)
		sem := session.NewSemaphore("reports/month-end", 2)
		if err := sem.TryLock(ctx); errors.Is(err, lockd.ErrBusy) {
			fmt.Println(server, "waits for a free slot")
			continue
		} else if err != nil {
			log.Fatal(err)
		}
		fmt.Println(server, "runs the report")
	}
	// Output:
	// reports-1 runs the report
	// reports-2 runs the report
	// reports-3 waits for a free slot
}

// Many servers read the price list while invoices go out; the nightly
// import replaces it alone.
func ExampleRWMutex() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	reader, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close(ctx)
	importer, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer importer.Close(ctx)

	prices := reader.NewRWMutex("price-list")
	if err := prices.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoicing with the current price list")

	imp := importer.NewRWMutex("price-list")
	if err := imp.TryLock(ctx); errors.Is(err, lockd.ErrBusy) {
		fmt.Println("import waits for the readers")
	}
	if err := prices.RUnlock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := imp.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("importing new prices")
	if err := imp.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// invoicing with the current price list
	// import waits for the readers
	// importing new prices
}

// A session's Done channel closes when its lease is lost or it is closed;
// Err says which.
func ExampleSession_Done() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	session, err := client.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	go session.Close(ctx) // somewhere else, at shutdown

	<-session.Done()
	fmt.Println(session.Err())
	// Output: lockd: session closed
}

// ExampleElection: of the copies of the invoice service, one leads and
// runs the scheduler; the others know who it is and take over, in order,
// when it steps down.
func ExampleElection() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())

	web1, err := client.NewSession(ctx, lockd.WithOwner("web-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer web1.Close(ctx)
	web2, err := client.NewSession(ctx, lockd.WithOwner("web-2"))
	if err != nil {
		log.Fatal(err)
	}
	defer web2.Close(ctx)

	first := web1.NewElection("invoices/scheduler")
	if err := first.Campaign(ctx, []byte("http://web-1:8080")); err != nil {
		log.Fatal(err)
	}
	leader, err := web2.NewElection("invoices/scheduler").Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leader: %s at %s\n", leader.Owner, leader.Value)

	// web-1 steps down (say, for a deploy); web-2 takes over.
	if err := first.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	second := web2.NewElection("invoices/scheduler")
	if err := second.Campaign(ctx, []byte("http://web-2:8080")); err != nil {
		log.Fatal(err)
	}
	leader, err = second.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leader: %s at %s\n", leader.Owner, leader.Value)
	// Output:
	// leader: web-1 at http://web-1:8080
	// leader: web-2 at http://web-2:8080
}
