package redislock_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/redislock"
	"github.com/lockd-dev/lockd/redislock/redistest"
)

func TestMain(m *testing.M) {
	if isWorker() {
		// A worker process of TestContention: the parent checks its log.
		os.Exit(m.Run())
	}
	redis.SetLogger(quiet{}) // connection errors are expected when tests stop servers
	flag.Parse()
	stop := startExampleServer()
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// newClient returns a single-instance Client on srv, closed by t.Cleanup.
func newClient(t testing.TB, srv *redistest.Server, opts ...redislock.Option) *redislock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := redislock.New(ctx, srv.Client(t), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// newRedlock returns a Redlock over srvs, closed by t.Cleanup.
func newRedlock(t testing.TB, srvs []*redistest.Server, opts ...redislock.Option) *redislock.Redlock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := redislock.NewRedlock(ctx, clients(t, srvs), opts...)
	if err != nil {
		t.Fatalf("NewRedlock: %v", err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

func clients(t testing.TB, srvs []*redistest.Server) []redis.UniversalClient {
	var out []redis.UniversalClient
	for _, s := range srvs {
		out = append(out, s.Client(t))
	}
	return out
}

func servers(t testing.TB, n int) []*redistest.Server {
	var out []*redistest.Server
	for range n {
		out = append(out, redistest.New(t))
	}
	return out
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitDone waits for a hold's Done, failing the test after limit.
func waitDone(t *testing.T, done <-chan struct{}, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-done:
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("lease-loss context not cancelled within %v", limit)
		return time.Time{}
	}
}

// TestEvictionPolicy: New and NewRedlock refuse a server that may evict
// keys, unless WithEviction accepts the risk.
func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"allkeys-lru", "volatile-ttl", "allkeys-random"} {
		srv := redistest.New(t, "--maxmemory-policy", policy)
		ctx := ctxT(t, 5*time.Second)
		if _, err := redislock.New(ctx, srv.Client(t)); !errors.Is(err, redislock.ErrEvictionPolicy) {
			t.Errorf("New with %s: got %v, want ErrEvictionPolicy", policy, err)
		}
		c, err := redislock.New(ctx, srv.Client(t), redislock.WithEviction())
		if err != nil {
			t.Errorf("New with %s and WithEviction: %v", policy, err)
		} else {
			_ = c.Close(ctx)
		}
	}
	srvs := servers(t, 3)
	if _, err := srvs[1].Do(ctxT(t, 5*time.Second), "CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"); err != nil {
		t.Fatal(err)
	}
	if _, err := redislock.NewRedlock(ctxT(t, 5*time.Second), clients(t, srvs)); !errors.Is(err, redislock.ErrEvictionPolicy) {
		t.Errorf("NewRedlock with one allkeys-lfu node: got %v, want ErrEvictionPolicy", err)
	}
}

// TestRedisDown: a Client on a server that went away reports
// lockd.ErrUnavailable, and New fails the same way.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	c := newClient(t, srv)
	srv.Stop()
	m := c.NewMutex("down")
	if err := m.TryLock(ctxT(t, 5*time.Second)); !errors.Is(err, lockd.ErrUnavailable) {
		t.Errorf("TryLock with redis down: got %v, want ErrUnavailable", err)
	}
	start := time.Now()
	err := m.Lock(ctxT(t, 300*time.Millisecond))
	if !errors.Is(err, lockd.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock with redis down: got %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Lock with redis down took %v", d)
	}
	if _, err := redislock.New(ctxT(t, 2*time.Second), srv.Client(t)); !errors.Is(err, lockd.ErrUnavailable) {
		t.Errorf("New with redis down: got %v, want ErrUnavailable", err)
	}
}

// TestOwnershipRelease (acceptance 4): after A's key expired and B took
// the lock, A's Unlock reports the loss and does not delete B's key.
func TestOwnershipRelease(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	ctx := ctxT(t, 10*time.Second)
	a := newClient(t, srv, redislock.WithTTL(5*time.Second)).NewMutex("owned")
	b := newClient(t, srv, redislock.WithTTL(5*time.Second)).NewMutex("owned")
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// Expire A's key on the server now, as if A had stalled past its TTL.
	if _, err := srv.Do(ctx, "PEXPIRE", "lockd:{owned}", 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatalf("B Lock after A's key expired: %v", err)
	}
	before, err := srv.Do(ctx, "GET", "lockd:{owned}")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("A Unlock after losing the key: got %v, want ErrLeaseLost", err)
	}
	after, err := srv.Do(ctx, "GET", "lockd:{owned}")
	if err != nil || after != before {
		t.Errorf("B's key after A's Unlock: got %v, %v; want %v", after, err, before)
	}
	if err := b.Err(); err != nil {
		t.Errorf("B's hold after A's Unlock: %v", err)
	}
	c := newClient(t, srv).NewMutex("owned")
	if err := c.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
		t.Errorf("C TryLock while B holds: got %v, want ErrBusy", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Errorf("B Unlock: %v", err)
	}

	// The same for a semaphore permit.
	sa := newClient(t, srv).NewSemaphore("owned-sem", 1)
	sb := newClient(t, srv).NewSemaphore("owned-sem", 1)
	if err := sa.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do(ctx, "DEL", "lockd:{owned-sem}"); err != nil { // as if expired and purged
		t.Fatal(err)
	}
	if err := sb.TryLock(ctx); err != nil {
		t.Fatalf("B TryLock after A's permit expired: %v", err)
	}
	if err := sa.Unlock(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("A semaphore Unlock after losing the permit: got %v, want ErrLeaseLost", err)
	}
	if n, err := srv.Do(ctx, "ZCARD", "lockd:{owned-sem}"); err != nil || n != int64(1) {
		t.Errorf("holders after A's Unlock: got %v, %v; want 1", n, err)
	}
}

// TestWatchdog (acceptance 3): a 1 s TTL lock held for 10 s of work keeps
// its lock; when the Redis process is stopped, the lease-loss context
// fires before the key can expire on the server.
func TestWatchdog(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	srv := redistest.New(t)
	ctx := ctxT(t, 30*time.Second)
	m := newClient(t, srv, redislock.WithTTL(ttl)).NewMutex("watchdog")
	other := newClient(t, srv).NewMutex("watchdog")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		select {
		case <-m.Done():
			t.Fatalf("lost the lock during the work: %v", m.Err())
		case <-time.After(ttl): // the work: ten times the TTL in all
		}
		if err := other.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
			t.Fatalf("another client's TryLock during the hold: got %v, want ErrBusy", err)
		}
	}
	if m.Err() != nil || m.Token() != token {
		t.Fatalf("after 10 s: Err %v, token %d (was %d)", m.Err(), m.Token(), token)
	}

	for attempt := 1; ; attempt++ {
		// When the key expires on the server, read just before the pause:
		// a renewal sent during the pause is processed only after it (so
		// PTTL after the pause proves nothing).
		before := m.Deadline()
		expiry := keyExpiry(t, srv, "lockd:{watchdog}")
		fired := make(chan time.Time, 1)
		context.AfterFunc(m.Context(), func() { fired <- time.Now() })
		srv.Pause()
		paused := time.Now()
		var at time.Time
		select {
		case at = <-fired:
		case <-time.After(2 * ttl):
			srv.Resume()
			t.Fatalf("lease-loss context not cancelled within %v of SIGSTOP", 2*ttl)
		}
		srv.Resume()
		if !errors.Is(m.Err(), lockd.ErrLeaseLost) {
			t.Fatalf("Err after pause: got %v, want ErrLeaseLost", m.Err())
		}
		if !m.Deadline().Equal(before) && attempt < 5 {
			// A renewal reached Redis between reading the expiry and the
			// pause, so the expiry read is stale: take the lock again and
			// measure again.
			t.Logf("attempt %d: a renewal landed between the expiry read and SIGSTOP; again", attempt)
			if err := m.Unlock(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
				t.Fatalf("Unlock of a lost hold: got %v, want ErrLeaseLost", err)
			}
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !at.Before(expiry) {
			t.Errorf("lease-loss context fired at %v, not before the key's expiry on the server at %v", at, expiry)
		}
		t.Logf("lease-loss context fired %v after SIGSTOP, %v before the key could expire", at.Sub(paused), expiry.Sub(at))
		break
	}
	if err := m.Unlock(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("Unlock of a lost hold: got %v, want ErrLeaseLost", err)
	}
}

// holdTokens takes and releases name n times and returns the tokens.
func holdTokens(t *testing.T, c *redislock.Client, name string, n int) []uint64 {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	var out []uint64
	m := c.NewMutex(name)
	for range n {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Token())
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func checkIncreasing(t *testing.T, tokens []uint64) {
	t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d is %d, not above the one before, %d", i, tokens[i], tokens[i-1])
		}
	}
}

// TestFlushAll (acceptance 5): FLUSHALL during a hold is noticed at the
// next renewal, and tokens issued afterwards, and after a restart without
// persistence, are above every earlier one.
func TestFlushAll(t *testing.T) {
	t.Parallel()
	const ttl = 900 * time.Millisecond
	srv := redistest.New(t)
	c := newClient(t, srv, redislock.WithTTL(ttl))
	ctx := ctxT(t, 20*time.Second)
	tokens := holdTokens(t, c, "flush", 50)
	m := c.NewMutex("flush")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, m.Token())
	if _, err := srv.Do(ctx, "FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	fired := waitDone(t, m.Done(), ttl)
	if !errors.Is(m.Err(), lockd.ErrLeaseLost) {
		t.Errorf("Err after FLUSHALL: got %v, want ErrLeaseLost", m.Err())
	}
	if d := fired.Sub(flushed); d > ttl/3+200*time.Millisecond {
		t.Errorf("loss noticed %v after the flush, want within one renewal interval (%v)", d, ttl/3)
	}
	tokens = append(tokens, holdTokens(t, c, "flush", 50)...)
	checkIncreasing(t, tokens)

	srv.Stop()
	srv.Start() // no persistence: comes back empty
	tokens = append(tokens, holdTokens(t, c, "flush", 5)...)
	checkIncreasing(t, tokens)

	// A counter restored from an older snapshot (behind) is raised too.
	if _, err := srv.Do(ctx, "SET", "lockd:{flush}:token", "7"); err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, holdTokens(t, c, "flush", 5)...)
	checkIncreasing(t, tokens)
}

// TestEviction (acceptance 5): a lock key evicted under memory pressure is
// noticed at the next renewal; later tokens are above the earlier ones.
func TestEviction(t *testing.T) {
	t.Parallel()
	const ttl = 900 * time.Millisecond
	srv := redistest.New(t, "--maxmemory-policy", "allkeys-random")
	c := newClient(t, srv, redislock.WithTTL(ttl), redislock.WithEviction())
	ctx := ctxT(t, 20*time.Second)
	tokens := holdTokens(t, c, "evict", 20)
	m := c.NewMutex("evict")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, m.Token())
	used := usedMemory(t, srv)
	if _, err := srv.Do(ctx, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used+512<<10, 10)); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 32<<10)
	evicted := time.Time{}
	for i := 0; i < 10000 && evicted.IsZero(); i++ {
		if _, err := srv.Do(ctx, "SET", fmt.Sprint("filler-", i), big); err != nil {
			t.Fatal(err)
		}
		n, err := srv.Do(ctx, "EXISTS", "lockd:{evict}")
		if err != nil {
			t.Fatal(err)
		}
		if n == int64(0) {
			evicted = time.Now()
		}
	}
	if evicted.IsZero() {
		t.Fatal("lock key never evicted")
	}
	fired := waitDone(t, m.Done(), ttl)
	if !errors.Is(m.Err(), lockd.ErrLeaseLost) {
		t.Errorf("Err after eviction: got %v, want ErrLeaseLost", m.Err())
	}
	t.Logf("eviction noticed %v after it happened", fired.Sub(evicted))
	if _, err := srv.Do(ctx, "CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, holdTokens(t, c, "evict", 20)...)
	checkIncreasing(t, tokens)
}

func usedMemory(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do(ctxT(t, 5*time.Second), "MEMORY", "STATS")
	if err != nil {
		t.Fatal(err)
	}
	switch s := v.(type) {
	case []any:
		for i := 0; i+1 < len(s); i += 2 {
			if s[i] == "total.allocated" {
				return s[i+1].(int64)
			}
		}
	case map[any]any:
		return s["total.allocated"].(int64)
	}
	t.Fatalf("MEMORY STATS without total.allocated: %v", v)
	return 0
}

// TestSemaphore: permits are shared up to the limit, each with its own
// increasing token, and a mismatch of permits or of lock kind is refused.
func TestSemaphore(t *testing.T) {
	t.Parallel()
	srv := redistest.New(t)
	ctx := ctxT(t, 10*time.Second)
	var sems []*redislock.Semaphore
	var last uint64
	for i := range 3 {
		s := newClient(t, srv).NewSemaphore("sem", 3)
		if err := s.TryLock(ctx); err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		if s.Token() <= last {
			t.Errorf("permit %d token %d not above %d", i, s.Token(), last)
		}
		last = s.Token()
		sems = append(sems, s)
	}
	fourth := newClient(t, srv).NewSemaphore("sem", 3)
	if err := fourth.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
		t.Errorf("fourth permit: got %v, want ErrBusy", err)
	}
	if err := newClient(t, srv).NewSemaphore("sem", 5).TryLock(ctx); !errors.Is(err, lockd.ErrLimitMismatch) {
		t.Errorf("other permits: got %v, want ErrLimitMismatch", err)
	}
	if err := newClient(t, srv).NewMutex("sem").TryLock(ctx); !errors.Is(err, lockd.ErrLimitMismatch) {
		t.Errorf("mutex on a semaphore: got %v, want ErrLimitMismatch", err)
	}
	done := make(chan error, 1)
	go func() { done <- fourth.Lock(ctx) }()
	if err := sems[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting permit: %v", err)
	}
	for _, s := range append(sems[1:], fourth) {
		if err := s.Unlock(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := newClient(t, srv).NewSemaphore("sem", 5).TryLock(ctx); err != nil {
		t.Errorf("permits of a free semaphore can change: %v", err)
	}
}

// keyExpiry returns when key expires on srv (wall clock, which the test
// shares with the server).
func keyExpiry(t *testing.T, srv *redistest.Server, key string) time.Time {
	t.Helper()
	v, err := srv.Do(ctxT(t, 5*time.Second), "PEXPIRETIME", key) // Redis 7.0+
	if err == nil {
		if ms, ok := v.(int64); ok && ms > 0 {
			return time.UnixMilli(ms)
		}
	}
	v, err = srv.Do(ctxT(t, 5*time.Second), "PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	ms, ok := v.(int64)
	if !ok || ms <= 0 {
		t.Fatalf("PTTL %v: key has no expiry", v)
	}
	return time.Now().Add(time.Duration(ms) * time.Millisecond)
}
