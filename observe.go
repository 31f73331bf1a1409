package lockd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// Proclaim replaces the value this session announced as leader, without
// giving up leadership: observers see the new value. It returns an error
// matching ErrNotHeld when this session is not the leader. A repeat after
// an unknown outcome is safe (the request keeps its sequence number).
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	m := e.current()
	if m == nil {
		return fmt.Errorf("proclaim %q: %w", e.name, ErrNotHeld)
	}
	return m.l.setValue(ctx, value)
}

// setValue replaces the value of the current hold on the server.
func (l *lock) setValue(ctx context.Context, value []byte) error {
	s := l.s
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	if h == nil {
		return fmt.Errorf("proclaim %q: %w", l.name, ErrNotHeld)
	}
	if len(value) > maxValueBytes {
		return fmt.Errorf("proclaim %q: value is %d bytes, more than %d: %w", l.name, len(value), maxValueBytes, ErrInvalidArgument)
	}
	if err := s.live(); err != nil {
		return fmt.Errorf("proclaim %q: %w", l.name, err)
	}
	bctx, stop := s.bind(ctx)
	defer stop()
	seq := s.seqs.Begin()
	defer seq.End()
	msg := &lockdv1.SetValueRequest{SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Name: l.name, Token: h.token, Value: value}
	_, err := wire.SetValue.Invoke(bctx, s.c.call, s.policy(wire.SetValue.PolicyOf(msg)), msg, nil)
	if errors.Is(err, ErrLeaseLost) {
		s.lose(err)
	}
	if err != nil {
		return fmt.Errorf("proclaim %q: %w", l.name, err)
	}
	return nil
}

// Observe yields the election's leader now and then at each change, in
// the order the cluster decided them: a new leader (a higher Token), or a
// new value of the same leader (Proclaim). A Leader with Token 0 means
// there is no leader. It needs no campaign; see Client.ObserveElection.
func (e *Election) Observe(ctx context.Context) iter.Seq2[Leader, error] {
	return e.s.c.ObserveElection(ctx, e.name)
}

// ObserveElection is Election.Observe without a session: it yields the
// leader of the election on name now and then at each change, until ctx
// ends (its error is yielded last) or the loop stops. It is built on
// Watch (with WatchState): it reconnects by itself, and after events were
// lost it reads the state again and yields the leader if it changed.
func (c *Client) ObserveElection(ctx context.Context, name string) iter.Seq2[Leader, error] {
	return func(yield func(Leader, error) bool) {
		var next, last Leader
		synced, yielded := false, false
		for ev, err := range c.Watch(ctx, name, WatchState()) {
			if err != nil && !errors.Is(err, ErrWatchReset) {
				yield(Leader{}, fmt.Errorf("observe %q: %w", name, err))
				return
			}
			if ev.Name != name && ev.Kind != EventReset && ev.Kind != EventSynced {
				continue // a longer name with this prefix
			}
			switch ev.Kind {
			case EventReset:
				synced, next = false, Leader{} // the state follows
				continue
			case EventHeld, EventGranted:
				next = Leader{SessionID: ev.Session, Owner: ev.Owner, Value: ev.Value, Token: ev.Token}
			case EventValueChanged:
				if ev.Token == next.Token {
					next.Value = ev.Value
				}
			case EventReleased, EventExpired, EventForceReleased, EventCompleted:
				if ev.Token == next.Token {
					next = Leader{}
				}
			case EventSynced:
				synced = true
			default:
				continue
			}
			if !synced || ev.Kind != EventSynced && !ev.EntryEnd || yielded && next.Token == last.Token && bytes.Equal(next.Value, last.Value) {
				continue
			}
			last, yielded = next, true
			if !yield(next, nil) {
				return
			}
		}
	}
}
