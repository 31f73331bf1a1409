package lockd

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
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

// kaResult is a session's outcome of one batched round.
type kaResult struct {
	sent  time.Time // the batch's first send time
	ttl   time.Duration
	err   error
	unary bool // no stream on the endpoint: renew with a unary KeepAlive
}

// kaScheduler renews the sessions of a Client in batches.
type kaScheduler struct {
	c    *Client
	mu   sync.Mutex
	due  map[*Session]time.Time
	wake chan struct{}
	once sync.Once
	stop chan struct{}
}

func newKAScheduler(c *Client) *kaScheduler {
	return &kaScheduler{c: c, due: map[*Session]time.Time{}, wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// schedule asks for s to be renewed at due; the outcome comes on s.ka.
func (k *kaScheduler) schedule(s *Session, due time.Time) {
	k.once.Do(func() { go k.run() })
	k.mu.Lock()
	k.due[s] = due
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// unschedule forgets s (its loop ends).
func (k *kaScheduler) unschedule(s *Session) {
	k.mu.Lock()
	delete(k.due, s)
	k.mu.Unlock()
}

// close ends the scheduler (Client.Close).
func (k *kaScheduler) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
}

// run sends a batch at each earliest due time.
func (k *kaScheduler) run() {
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
		var batch []*Session
		k.mu.Lock()
		for s, d := range k.due {
			if !d.After(now.Add(wire.EarlyBy(s.ttl))) {
				batch = append(batch, s)
				delete(k.due, s)
			}
		}
		k.mu.Unlock()
		for _, f := range wire.SplitBatch(batch, sessionEntry) {
			go k.send(f, now)
		}
	}
}

// send renews one batch and hands each session its outcome.
func (k *kaScheduler) send(batch []*Session, sent time.Time) {
	c := k.c
	ttl, until := batch[0].ttl, batch[0].Deadline()
	frame := &lockdv1.KeepAliveBatch{Sessions: make([]*lockdv1.KeepAliveRequest, len(batch))}
	for i, s := range batch {
		ttl = min(ttl, s.ttl)
		if d := s.Deadline(); d.Before(until) {
			until = d
		}
		frame.Sessions[i] = &lockdv1.KeepAliveRequest{SessionId: s.id, Secret: s.secret}
	}
	// One attempt (and an immediate one on another endpoint after a broken
	// stream or a leader hint), like a single session's keepalive: the
	// sessions' loops run the jeopardy schedule.
	p := wire.Policy{Idempotent: true, Once: true, Abandon: true, Timeout: keepaliveTimeout(ttl, c.cfg.requestTimeout), Until: func() time.Time { return until }}
	var resp *lockdv1.KeepAliveBatchResponse
	unary := false
	err := c.call.Do(context.Background(), p, "", func(ctx context.Context, ep *wire.Node) error {
		r, err := c.streamCall(ctx, ep, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: frame}})
		if errors.Is(err, wire.ErrNoStream) {
			unary = true
			return nil
		}
		if err != nil {
			if d := wire.ErrorDetail(err); d != nil {
				if cerr := c.eps.CheckCluster(ep, d.GetClusterId()); cerr != nil {
					return cerr
				}
			}
			return err
		}
		if err := c.eps.CheckCluster(ep, r.GetClusterId()); err != nil {
			return err
		}
		resp = r.GetKeepAlive()
		if resp == nil || len(resp.GetResults()) != len(batch) {
			return connect.NewError(connect.CodeInternal, errors.New("keepalive batch: malformed answer"))
		}
		return nil
	})
	for i, s := range batch {
		r := kaResult{sent: sent, err: err, unary: unary}
		if err == nil && !unary {
			res := resp.GetResults()[i]
			if res.GetSessionId() != s.id {
				r.err = connect.NewError(connect.CodeInternal, errors.New("keepalive batch: answer names another session"))
			} else if e := res.GetError(); e != nil {
				r.err = mapError(wire.FromStreamError(e), "")
			} else {
				r.ttl = res.GetTtl().AsDuration()
			}
		}
		select {
		case s.ka <- r:
		default: // the session's loop is gone
		}
	}
}

// sessionEntry is what a session puts in a KeepAliveBatch frame.
func sessionEntry(s *Session) (id, secret string) { return s.id, s.secret }
