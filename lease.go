package lockd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/internal/lease"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// The client's side of a session's lease: its deadline (the rule is
// lease.ClientDeadline), and the keepalive loop that moves it.

// lease is the client's view of a session's lease. It is pure state: the
// caller supplies the clock.
type clientLease struct {
	sent     time.Time // send time of the newest confirmed KeepAlive
	deadline time.Time
	lost     bool
}

// confirm records that a KeepAlive first sent at sent was confirmed with
// the granted ttl, at time now. It reports whether the deadline moved
// later. A confirmation that arrives at or after the deadline does not
// revive the lease: it is lost. A reply to an older KeepAlive never moves
// the deadline back.
func (l *clientLease) confirm(sent time.Time, ttl time.Duration, now time.Time) bool {
	if l.lost {
		return false
	}
	if !now.Before(l.deadline) {
		l.lost = true
		return false
	}
	d := lease.ClientDeadline(sent, ttl)
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
	p := wire.Policy{Idempotent: true, Once: true, Abandon: true, Timeout: wire.KeepaliveTimeout(s.ttl, s.c.cfg.requestTimeout), Until: s.Deadline}
	s.mu.Lock()
	next := s.lease.sent.Add(lease.RenewInterval(s.ttl))
	s.mu.Unlock()
	for s.ctx.Err() == nil {
		sent, ttl, err := s.renew(p, next)
		if s.ctx.Err() != nil {
			continue
		}
		switch {
		case err == nil:
			if ttl <= 0 {
				ttl = s.ttl
			}
			s.confirmed(sent, ttl)
			s.mu.Lock()
			next = s.lease.sent.Add(lease.RenewInterval(ttl))
			s.mu.Unlock()
		case s.ctx.Err() != nil:
		case errors.Is(err, ErrLeaseLost):
			s.lose(fmt.Errorf("keepalive: %w", err))
		default:
			s.c.logger.Warn("keepalive failed", "session", s.id, "err", err)
			next = time.Now().Add(lease.JeopardyInterval(s.ttl))
		}
	}
	if s.ren != nil {
		s.c.ka.Unschedule(s.ren)
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

// renew renews the lease at next: in the client's next keepalive batch
// over the session stream, else (no stream, or none on the endpoint) with
// a unary KeepAlive. It returns the send time to confirm from and the TTL
// granted; it returns early when the session ends.
func (s *Session) renew(p wire.Policy, next time.Time) (time.Time, time.Duration, error) {
	if s.c.cfg.stream {
		if s.ren == nil {
			s.ren = &wire.Renewal{ID: s.id, Secret: s.secret, TTL: s.ttl, Deadline: s.Deadline, Out: make(chan wire.KAResult, 1)}
		}
		s.c.ka.Schedule(s.ren, next)
		select {
		case <-s.ctx.Done():
			s.c.ka.Unschedule(s.ren)
			return time.Time{}, 0, s.ctx.Err()
		case r := <-s.ren.Out:
			if !r.Unary {
				return r.Sent, r.TTL, r.Err
			}
		}
	} else {
		t := time.NewTimer(time.Until(next))
		select {
		case <-s.ctx.Done():
			t.Stop()
			return time.Time{}, 0, s.ctx.Err()
		case <-t.C:
		}
	}
	sent := time.Now()
	resp, err := wire.KeepAlive.Invoke(s.ctx, s.c.call, p, &lockdv1.KeepAliveRequest{SessionId: s.id, Secret: s.secret}, nil)
	if err != nil {
		return sent, 0, err
	}
	return sent, resp.Msg.GetTtl().AsDuration(), nil
}
