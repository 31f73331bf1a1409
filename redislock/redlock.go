package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
)

// Redlock makes locks over N independent Redis nodes (N odd, at least 3;
// masters of their own, not replicas of each other) with the Redlock
// algorithm. A lock is held when a majority of the nodes took it within
// its validity, TTL − elapsed − drift (drift = TTL·1 % + 2 ms); each node
// gets a short per-node timeout (WithRequestTimeout, default 100 ms), so a
// down node costs little. A failed attempt is undone on every node and
// retried after a random delay. Renewal and release go to every node;
// renewal needs a majority.
//
// Redlock issues no fencing token (Token is always 0): a counter on each
// node is not one sequence, and a majority's counters do not order grants
// across two overlapping majorities. Its safety rests on timing: clocks
// that run at nearly the same rate, and holders that are not paused past
// the validity. A GC pause, a stopped VM or a clock jump on a node breaks
// it, and nothing downstream can catch the stale holder. Prefer lockd (or
// a single instance with tokens) where a fencing token matters. Redlock
// offers no semaphores: NewSemaphore of its Backend fails with
// errors.ErrUnsupported.
//
// A Redlock is safe for concurrent use; it does not own the go-redis
// clients it was given.
type Redlock struct {
	nodes  []redis.UniversalClient
	quorum int
	b      *backend
}

// NewRedlock returns a Redlock over nodes. It checks every node as New
// does (reachable nodes only: at least a majority must answer, otherwise
// the error matches ErrNoQuorum) and refuses an evicting maxmemory-policy
// with ErrEvictionPolicy unless WithEviction is given. The request timeout
// is per node (default DefaultNodeTimeout).
func NewRedlock(ctx context.Context, nodes []redis.UniversalClient, opts ...Option) (*Redlock, error) {
	if len(nodes) < 3 || len(nodes)%2 == 0 {
		return nil, fmt.Errorf("%w: redislock: redlock needs an odd number of nodes, at least 3 (got %d)", lockd.ErrInvalidArgument, len(nodes))
	}
	for i, n := range nodes {
		if n == nil {
			return nil, fmt.Errorf("%w: redislock: node %d is nil", lockd.ErrInvalidArgument, i)
		}
	}
	cfg, err := newConfig(DefaultNodeTimeout, opts)
	if err != nil {
		return nil, err
	}
	r := &Redlock{nodes: nodes, quorum: len(nodes)/2 + 1, b: newBackend(cfg)}
	// The check is two round trips; a node gets at least a second for it.
	res := r.each(ctx, nil, max(cfg.timeout, time.Second), func(ctx context.Context, _ int, n redis.UniversalClient) (int64, error) {
		return 0, checkServer(ctx, n, cfg)
	})
	reachable := 0
	for i, x := range res {
		if errors.Is(x.err, ErrEvictionPolicy) {
			return nil, fmt.Errorf("redislock: node %d: %w", i, x.err)
		}
		if x.err == nil {
			reachable++
		}
	}
	if reachable < r.quorum {
		return nil, fmt.Errorf("%w: %d of %d nodes reachable: %w", ErrNoQuorum, reachable, len(nodes), firstErr(res))
	}
	return r, nil
}

// NewMutex returns an exclusive lock on name over the nodes. Its Token is
// always 0.
func (r *Redlock) NewMutex(name string) *Mutex {
	key, _, _, _ := r.b.keys(name)
	return &Mutex{l: newLock(r.b, name, &redlockStore{r: r, key: []string{key}})}
}

// Backend returns the Redlock as a lockd.Backend. Its NewSemaphore returns
// a handle whose calls fail with errors.ErrUnsupported.
func (r *Redlock) Backend() lockd.Backend { return redlockBackend{r} }

// Close releases every lock the Redlock holds (best effort, within ctx).
// Later acquires fail with lockd.ErrClosed.
func (r *Redlock) Close(ctx context.Context) error { return r.b.close(ctx) }

type redlockBackend struct{ r *Redlock }

func (b redlockBackend) NewMutex(name string) lockd.Locker { return b.r.NewMutex(name) }

func (b redlockBackend) NewSemaphore(name string, permits uint32) lockd.Locker {
	return unsupported{name: name, err: fmt.Errorf("redislock: semaphore %q: Redlock offers no semaphores: %w", name, errors.ErrUnsupported)}
}

// unsupported is a Locker whose every acquire fails.
type unsupported struct {
	name string
	err  error
}

func (u unsupported) Lock(context.Context) error    { return u.err }
func (u unsupported) TryLock(context.Context) error { return u.err }
func (u unsupported) Unlock(context.Context) error {
	return fmt.Errorf("redislock: release %q: %w", u.name, lockd.ErrNotHeld)
}
func (u unsupported) Token() uint64            { return 0 }
func (u unsupported) Context() context.Context { return notHeldCtx }
func (u unsupported) Done() <-chan struct{}    { return notHeldCtx.Done() }
func (u unsupported) Err() error               { return lockd.ErrNotHeld }
func (u unsupported) Name() string             { return u.name }

// result is one node's answer.
type result struct {
	v   int64
	err error
}

// each runs f on the nodes (all of them when only is nil, else those with
// only[i]) concurrently, each under timeout (the per-node timeout), and returns
// their answers in node order. A node that has not answered by its timeout
// counts as failed even if its call goes on (a go-redis client without
// ContextTimeoutEnabled may block until its ReadTimeout): nothing waits
// longer than one per-node timeout.
func (r *Redlock) each(ctx context.Context, only []bool, timeout time.Duration, f func(context.Context, int, redis.UniversalClient) (int64, error)) []result {
	type answer struct {
		i int
		result
	}
	res := make([]result, len(r.nodes))
	ch := make(chan answer, len(r.nodes))
	n := 0
	for i, node := range r.nodes {
		res[i].err = errors.New("not asked")
		if only != nil && !only[i] {
			continue
		}
		res[i].err = fmt.Errorf("no answer within the per-node timeout %v", timeout)
		n++
		go func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := f(nctx, i, node)
			ch <- answer{i, result{v, err}}
		}()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for ; n > 0; n-- {
		select {
		case a := <-ch:
			res[a.i] = a.result
		case <-t.C:
			return res
		case <-ctx.Done():
			return res
		}
	}
	return res
}

func firstErr(res []result) error {
	for _, x := range res {
		if x.err != nil {
			return x.err
		}
	}
	return nil
}

// redlockStore is a mutex over the Redlock nodes.
type redlockStore struct {
	r   *Redlock
	key []string
}

func (s *redlockStore) channel() string { return "" }

// Answers of mutexAcquire: granted (1), busy (0), other type (-1).
func (s *redlockStore) acquire(ctx context.Context, owner string) (bool, uint64, time.Duration, error) {
	r := s.r
	ttl := ttlArg(&r.b.cfg)
	res := r.each(ctx, nil, r.b.cfg.timeout, func(ctx context.Context, _ int, n redis.UniversalClient) (int64, error) {
		code, pttl, err := pair(mutexAcquire.Run(ctx, n, []string{s.key[0], s.key[0]}, owner, ttl, "0").Result())
		if err != nil {
			return 0, err
		}
		if code == 1 {
			return -1, nil
		}
		return max(pttl, 0), nil // busy: the holder's remaining TTL
	})
	granted, busy := 0, 0
	var hint time.Duration
	undo := make([]bool, len(res))
	for i, x := range res {
		switch {
		case x.err != nil:
			undo[i] = true // unknown outcome
		case x.v == -1:
			granted++
			undo[i] = true
		default:
			busy++
			if d := time.Duration(x.v) * time.Millisecond; hint == 0 || d < hint {
				hint = d
			}
		}
	}
	if granted >= r.quorum {
		return true, 0, 0, nil
	}
	r.releaseKey(ctx, undo, s.key, owner)
	if granted+busy < r.quorum {
		return false, 0, 0, fmt.Errorf("%w: %d of %d nodes answered, %d needed: %w", ErrNoQuorum, granted+busy, len(res), r.quorum, firstErr(res))
	}
	return false, 0, hint, nil
}

func (s *redlockStore) extend(ctx context.Context, owner string) error {
	r := s.r
	ttl := ttlArg(&r.b.cfg)
	return r.tally(r.each(ctx, nil, r.b.cfg.timeout, func(ctx context.Context, _ int, n redis.UniversalClient) (int64, error) {
		return mutexExtend.Run(ctx, n, s.key, owner, ttl).Int64()
	}))
}

func (s *redlockStore) release(ctx context.Context, owner string) error {
	return s.r.tally(s.r.releaseKey(ctx, nil, s.key, owner))
}

// releaseKey compare-and-deletes owner's key on the chosen nodes, even when
// ctx has ended (bounded by one per-node timeout).
func (r *Redlock) releaseKey(ctx context.Context, only []bool, key []string, owner string) []result {
	return r.each(context.WithoutCancel(ctx), only, r.b.cfg.timeout, func(ctx context.Context, _ int, n redis.UniversalClient) (int64, error) {
		return mutexRelease.Run(ctx, n, key, owner, "").Int64()
	})
}

// tally turns per-node 1/0 answers into nil (a majority did it), errGone
// (a majority no longer has our key), or ErrNoQuorum.
func (r *Redlock) tally(res []result) error {
	ok, gone := 0, 0
	for _, x := range res {
		switch {
		case x.err != nil:
		case x.v == 1:
			ok++
		default:
			gone++
		}
	}
	switch {
	case ok >= r.quorum:
		return nil
	case gone > len(res)-r.quorum:
		return errGone
	default:
		return fmt.Errorf("%w: %d of %d nodes confirmed, %d needed: %w", ErrNoQuorum, ok, len(res), r.quorum, firstErr(res))
	}
}
