package wire

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Keepalives that scale: over the session stream, the sessions of one
// Client are renewed together. A client-wide scheduler keeps each
// session's next due time; at the earliest one it sends one KeepAliveBatch
// naming every session due within a small window (sending early is safe:
// it only moves the deadline sooner, from an earlier send time), so the
// sessions of a client fall into step after their first round and a round
// costs one frame and one leadership check on the server, not one HTTP
// exchange per session. Each session's lease is confirmed at the batch's
// first send time (lease.ClientDeadline, unchanged). Where no stream can be
// used (fallback, or WithStream(false)), each session sends its own
// unary KeepAlive.

// Renewal is one session as the scheduler sees it: what its KeepAlive
// names, its TTL and deadline, and where each round's outcome goes.
type Renewal struct {
	ID, Secret string
	TTL        time.Duration
	Deadline   func() time.Time
	Out        chan KAResult // buffered (1): an outcome nobody waits for is dropped
}

// minKeepaliveAttempt is the shortest time one KeepAlive attempt gets.
const minKeepaliveAttempt = 50 * time.Millisecond

// KeepaliveTimeout bounds one KeepAlive attempt, so that a hung endpoint
// leaves time to try another before the deadline.
func KeepaliveTimeout(ttl, requestTimeout time.Duration) time.Duration {
	return min(requestTimeout, max(minKeepaliveAttempt, ttl/4))
}

// KAResult is a session's outcome of one batched round.
type KAResult struct {
	Sent  time.Time // the batch's first send time
	TTL   time.Duration
	Err   error
	Unary bool // no stream on the endpoint: renew with a unary KeepAlive
}

// KAScheduler renews the sessions of a Client in batches.
type KAScheduler struct {
	c    *Caller
	mu   sync.Mutex
	due  map[*Renewal]time.Time
	wake chan struct{}
	once sync.Once
	stop chan struct{}
}

func NewKAScheduler(c *Caller) *KAScheduler {
	return &KAScheduler{c: c, due: map[*Renewal]time.Time{}, wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// Schedule asks for s to be renewed at due; the outcome comes on s.Out.
func (k *KAScheduler) Schedule(s *Renewal, due time.Time) {
	k.once.Do(func() { go k.run() })
	k.mu.Lock()
	k.due[s] = due
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Unschedule forgets s (its loop ends).
func (k *KAScheduler) Unschedule(s *Renewal) {
	k.mu.Lock()
	delete(k.due, s)
	k.mu.Unlock()
}

// Close ends the scheduler (Client.Close).
func (k *KAScheduler) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
}

// run sends a batch at each earliest due time.
func (k *KAScheduler) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		k.mu.Lock()
		var first time.Time
		for _, d := range k.due {
			if first.IsZero() || d.Before(first) {
				first = d
			}
		}
		k.mu.Unlock()
		wait := time.Hour
		if !first.IsZero() {
			wait = time.Until(first)
		}
		t.Reset(wait)
		select {
		case <-k.stop:
			return
		case <-k.wake:
			t.Stop()
			continue
		case <-t.C:
		}
		now := time.Now()
		var batch []*Renewal
		k.mu.Lock()
		for s, d := range k.due {
			if !d.After(now.Add(EarlyBy(s.TTL))) {
				batch = append(batch, s)
				delete(k.due, s)
			}
		}
		k.mu.Unlock()
		for _, f := range SplitBatch(batch, renewalEntry) {
			go k.send(f, now)
		}
	}
}

// send renews one batch and hands each session its outcome.
func (k *KAScheduler) send(batch []*Renewal, sent time.Time) {
	c := k.c
	ttl, until := batch[0].TTL, batch[0].Deadline()
	frame := &lockdv1.KeepAliveBatch{Sessions: make([]*lockdv1.KeepAliveRequest, len(batch))}
	for i, s := range batch {
		ttl = min(ttl, s.TTL)
		if d := s.Deadline(); d.Before(until) {
			until = d
		}
		frame.Sessions[i] = &lockdv1.KeepAliveRequest{SessionId: s.ID, Secret: s.Secret}
	}
	// One attempt (and an immediate one on another endpoint after a broken
	// stream or a leader hint), like a single session's keepalive: the
	// sessions' loops run the jeopardy schedule.
	p := Policy{Idempotent: true, Once: true, Abandon: true, Timeout: KeepaliveTimeout(ttl, c.RequestTimeout), Until: func() time.Time { return until }}
	var resp *lockdv1.KeepAliveBatchResponse
	unary := false
	err := c.Do(context.Background(), p, "", func(ctx context.Context, ep *Node) error {
		r, err := c.StreamCall(ctx, ep, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: frame}})
		if errors.Is(err, ErrNoStream) {
			unary = true
			return nil
		}
		if err != nil {
			if d := ErrorDetail(err); d != nil {
				if cerr := c.Eps.CheckCluster(ep, d.GetClusterId()); cerr != nil {
					return cerr
				}
			}
			return err
		}
		if err := c.Eps.CheckCluster(ep, r.GetClusterId()); err != nil {
			return err
		}
		resp = r.GetKeepAlive()
		if resp == nil || len(resp.GetResults()) != len(batch) {
			return connect.NewError(connect.CodeInternal, errors.New("keepalive batch: malformed answer"))
		}
		return nil
	})
	for i, s := range batch {
		r := KAResult{Sent: sent, Err: err, Unary: unary}
		if err == nil && !unary {
			res := resp.GetResults()[i]
			if res.GetSessionId() != s.ID {
				r.Err = connect.NewError(connect.CodeInternal, errors.New("keepalive batch: answer names another session"))
			} else if e := res.GetError(); e != nil {
				r.Err = c.MapError(FromStreamError(e), "")
			} else {
				r.TTL = res.GetTtl().AsDuration()
			}
		}
		select {
		case s.Out <- r:
		default: // the session's loop is gone
		}
	}
}

// renewalEntry is what a session puts in a KeepAliveBatch frame.
func renewalEntry(r *Renewal) (id, secret string) { return r.ID, r.Secret }
