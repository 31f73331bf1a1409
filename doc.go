// Package lockd is the Go client of lockd, a distributed lock service.
//
// # The story
//
// Your billing service runs on eight servers, and every one of them runs the
// same cron job on the first of the month: "send this month's invoices".
// Invoices must go out exactly once. Each copy of the job asks lockd first:
//
//	client, err := lockd.New(lockd.WithEndpoints("lockd-1:7070", "lockd-2:7070", "lockd-3:7070"))
//	...
//	session, err := client.NewSession(ctx, lockd.WithTTL(15*time.Second))
//	...
//	defer session.Close(context.Background())
//
//	mu := session.NewMutex("invoices/2025-01")
//	if err := mu.TryLock(ctx); errors.Is(err, lockd.ErrBusy) {
//		return nil // another server is sending them
//	}
//	defer mu.Unlock(context.Background())
//	return sendInvoices(mu.Context(), mu.Token())
//
// One copy gets the lock; the others see ErrBusy (a *BusyError naming the
// holder) and go back to sleep. A copy that would rather wait its turn
// calls Lock instead: it queues on the server, first come first served, and
// is woken when the lock is free — nobody polls.
//
// # Sessions and leases
//
// A Session is a lease the client keeps alive in the background. Every lock
// belongs to a session; when the session ends — Close, a crash, a network
// partition, a process paused for longer than its TTL — the server releases
// its locks and hands them to the next in line. The client declares the
// lease lost strictly before any server may expire it, and says so:
// Session.Done is closed and Session.Context cancelled, and so are the
// Context of every lock the session held. Run the protected work under the
// lock's Context, and it stops before anyone else can be granted the lock.
//
// Once lost, a session stays lost; make a new one. Calls on it fail with an
// error matching ErrLeaseLost.
//
// # Fencing tokens
//
// A lease cannot stop a holder that was paused (a long GC, a stopped VM)
// and wakes up after its lease ended, still believing it holds the lock.
// Every grant therefore carries a fencing token (Token), strictly larger
// than every token granted before it, across the whole life of the cluster.
// Pass it with every write to the resource the lock protects — the invoice
// table, say — and have the resource refuse a token older than one it has
// seen. The paused holder's late writes are then refused.
//
// # Locks
//
// Mutex is exclusive. Semaphore lets a fixed number of holders in at once
// (three report generators, say). RWMutex lets any number of readers in, or
// one writer; a waiting writer holds back the readers behind it. Locks are
// not re-entrant: a session that already holds or waits for a lock gets
// ErrAlreadyHeld.
//
// # Errors and retries
//
// Every call that can block takes a context. A client starts at a random
// endpoint, then keeps to the one that last answered or that a server
// named as leader (in any answer), and passes over an endpoint that did not
// answer lately. Each attempt has its own timeout (WithRequestTimeout),
// shortened when the context's deadline or the session's lease leaves less;
// failed attempts are retried with exponential backoff and full jitter
// across all endpoints, as long as the retry is safe (every mutating
// request carries a request id, so the server answers a repeat with its
// first answer). When the context ends mid-retry, the error matches both
// the context's error and the last attempt's. A call whose context has no
// deadline stops retrying after the retry timeout (WithRetryTimeout, 30 s);
// WithConnectTimeout stops any call sooner when no server answers at all.
// Errors match the sentinels in this package with errors.Is: ErrBusy,
// ErrNotHeld, ErrLeaseLost, ErrUnavailable and the rest.
//
// For calls this package does not wrap (describe, list, status,
// force-release), Client.Service gives the raw API with the same failover;
// Client.ClusterService does the same for membership, and Client.Snapshot
// downloads a backup.
package lockd
