// Package redislock provides lockd's Go lock interfaces over Redis: a
// single instance (Client) and Redlock over N independent nodes (Redlock).
// It works with any server speaking the Redis protocol through
// github.com/redis/go-redis/v9 (Redis 5 or later, Valkey, KeyDB,
// Dragonfly).
//
// The handles look like lockd's: Lock, TryLock, Unlock, Token, and a
// Context/Done/Err that ends when the hold is lost. Client.Backend and
// Redlock.Backend return a lockd.Backend, so that application code written
// against lockd.Locker switches backend with one constructor:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	locks, err := redislock.New(ctx, rdb, redislock.WithTTL(10*time.Second))
//	if err != nil { return err }
//	defer locks.Close(context.Background())
//
//	m := locks.NewMutex("invoices/2026-11")
//	if err := m.TryLock(ctx); errors.Is(err, lockd.ErrBusy) {
//		return nil // another copy is on it
//	}
//	defer m.Unlock(context.Background())
//	return sendInvoices(m.Context(), m.Token())
//
// Errors are lockd's sentinels (lockd.ErrBusy, lockd.ErrNotHeld,
// lockd.ErrLeaseLost, lockd.ErrUnavailable, ...) plus ErrNoQuorum and
// ErrEvictionPolicy, so errors.Is checks are the same whatever the
// backend.
//
// # How it works
//
// Acquire is SET key owner NX PX ttl with a random 128-bit owner value, in
// a Lua script that also takes the fencing token: INCR of a per-lock
// counter key that never expires, raised to the server's TIME in
// microseconds when it is below it. Release and renewal are
// compare-and-delete and compare-and-pexpire scripts, so a client never
// deletes or extends a key another owner holds. A held lock is renewed
// every TTL/3 by a watchdog goroutine; its Context is cancelled at the
// client deadline sent + TTL·0.99 − max(100 ms, 2 % TTL) of the last
// confirmed acquire or renewal (lockd's client deadline rule; Redis set the
// key's expiry at least TTL after sent), or at once when a renewal finds
// the key gone or another's. Lock retries with exponential backoff and full
// jitter, capped by the holder's remaining TTL, and a release publishes a
// pub/sub message that wakes waiters early. A semaphore is a sorted set of
// owners scored by their expiry on the server's TIME.
//
// # What it promises, and what it cannot
//
// On a single instance, holders are mutually exclusive while the Redis
// process keeps its data and does not evict, and while the holder's
// process is not paused between checking Context and acting. Redis's
// asynchronous replication means a failover to a replica can lose a lock:
// the guarantees are for one instance. Eviction (refused at construction
// unless WithEviction), FLUSHALL or a restart without persistence can hand
// a held lock to someone else; the holder learns it at its next renewal,
// at most TTL/3 later. Tokens are strictly increasing per lock on one
// server, across key expiry, flushes, eviction of the counter and restarts
// — unless the server's clock steps back past the time of earlier grants
// while the counter is also lost. A forward clock jump on the server can
// expire semaphore permits early and over-grant. Waiters are not served in
// order (no queue), and a contended lock hands over far more slowly than
// lockd's FIFO queue.
//
// Redlock tolerates a minority of nodes down, but issues no fencing token
// and rests on timing assumptions (bounded clock drift, no process pauses
// past the validity); see Redlock. There are no read-write locks on Redis:
// without a server-side queue, polling writers starve behind overlapping
// readers, and lockd promises writers do not starve. Use lockd's RWMutex.
//
// docs/backends.md compares the backends.
package redislock
