package redislock

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// waker delivers release notifications to waiters over one pub/sub
// connection per Client. A channel is subscribed while someone waits on
// it. A notification is only a hint to try again now: a missed one costs
// latency (the waiter's backoff timer still runs), never safety.
type waker struct {
	rdb redis.UniversalClient
	cfg config

	mu     sync.Mutex
	ps     *redis.PubSub
	loop   chan struct{} // closed when the receive loop exits
	subs   map[string]map[chan struct{}]struct{}
	closed bool
}

func newWaker(rdb redis.UniversalClient, cfg config) *waker {
	return &waker{rdb: rdb, cfg: cfg, subs: map[string]map[chan struct{}]struct{}{}}
}

// watch returns a channel that receives after a release is published on
// ch, and a function to stop watching.
func (w *waker) watch(ch string) (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, func() {}
	}
	if w.ps == nil {
		w.ps = w.rdb.Subscribe(context.Background())
		w.loop = make(chan struct{})
		go w.run(w.ps.Channel(), w.loop)
	}
	m := w.subs[ch]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		w.subs[ch] = m
		w.call(w.ps.Subscribe, ch)
	}
	m[c] = struct{}{}
	return c, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(m, c)
		if len(m) == 0 && w.subs[ch] != nil && len(w.subs[ch]) == 0 {
			delete(w.subs, ch)
			if !w.closed {
				w.call(w.ps.Unsubscribe, ch)
			}
		}
	}
}

// call runs a (un)subscribe under w.mu, so that they reach the server in
// order.
func (w *waker) call(f func(context.Context, ...string) error, ch string) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.timeout)
	defer cancel()
	if err := f(ctx, ch); err != nil {
		w.cfg.logger.Debug("pubsub subscription change failed", "channel", ch, "err", err)
	}
}

func (w *waker) run(msgs <-chan *redis.Message, done chan struct{}) {
	defer close(done)
	for msg := range msgs {
		w.mu.Lock()
		for c := range w.subs[msg.Channel] {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}

func (w *waker) close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	ps, loop := w.ps, w.loop
	w.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-loop
	return err
}
