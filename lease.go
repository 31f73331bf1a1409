package lockd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// The client's side of a session's lease: its deadline (the rule is
// retry.LeaseDeadline), and the keepalive loop that moves it.

// minKeepaliveAttempt is the shortest time one KeepAlive attempt gets.
const minKeepaliveAttempt = 50 * time.Millisecond

// keepaliveTimeout bounds one KeepAlive attempt, so that a hung endpoint
// leaves time to try another before the deadline.
func keepaliveTimeout(ttl, requestTimeout time.Duration) time.Duration {
	return min(requestTimeout, max(minKeepaliveAttempt, ttl/4))
}

// lease is the client's view of a session's lease. It is pure state: the
// caller supplies the clock.
type lease struct {
	sent     time.Time // send time of the newest confirmed KeepAlive
	deadline time.Time
	lost     bool
}

// confirm records that a KeepAlive first sent at sent was confirmed with
// the granted ttl, at time now. It reports whether the deadline moved
// later. A confirmation that arrives at or after the deadline does not
// revive the lease: it is lost. A reply to an older KeepAlive never moves
// the deadline back.
func (l *lease) confirm(sent time.Time, ttl time.Duration, now time.Time) bool {
	if l.lost {
		return false
	}
	if !now.Before(l.deadline) {
		l.lost = true
		return false
	}
	d := retry.LeaseDeadline(sent, ttl)
	if !d.After(l.deadline) {
		return false
	}
	l.sent, l.deadline = sent, d
	return true
}

// keepalive renews the lease until the session ends, then (if the lease was
// lost rather than closed) tries to close the session on the server.
func (s *Session) keepalive() {
	defer close(s.loopDone)
	// A KeepAlive attempt that outlives the lease is useless: it ends
	// at the deadline, or sooner to leave time for another endpoint.
	p := policy{idempotent: true, once: true, timeout: keepaliveTimeout(s.ttl, s.c.cfg.requestTimeout), until: s.Deadline}
	s.mu.Lock()
	next := s.lease.sent.Add(retry.RenewInterval(s.ttl))
	s.mu.Unlock()
	for s.ctx.Err() == nil {
		t := time.NewTimer(time.Until(next))
		select {
		case <-s.ctx.Done():
			t.Stop()
			continue
		case <-t.C:
		}
		sent := time.Now()
		resp, err := rpcKeepAlive.invoke(s.ctx, s.c, p, &lockdv1.KeepAliveRequest{SessionId: s.id}, nil)
		switch {
		case err == nil:
			ttl := resp.Msg.GetTtl().AsDuration()
			if ttl <= 0 {
				ttl = s.ttl
			}
			s.confirmed(sent, ttl)
			s.mu.Lock()
			next = s.lease.sent.Add(retry.RenewInterval(ttl))
			s.mu.Unlock()
		case s.ctx.Err() != nil:
		case errors.Is(err, ErrLeaseLost):
			s.lose(fmt.Errorf("keepalive: %w", err))
		default:
			s.c.logger.Warn("keepalive failed", "session", s.id, "err", err)
			next = time.Now().Add(retry.JeopardyInterval(s.ttl))
		}
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing || errors.Is(s.Err(), ErrClosed) {
		return // Close tells the server
	}
	// Lost: drop the session on the server too, so that its locks go to
	// others now rather than at the server's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), s.c.cfg.requestTimeout)
	defer cancel()
	if err := s.closeOnServer(ctx); err != nil {
		s.c.logger.Debug("close of lost session failed", "session", s.id, "err", err)
	}
	s.c.removeSession(s)
}
