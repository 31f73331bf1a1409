package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/lease"
)

// capabilities are the optional parts of the protocol this driver serves.
var capabilities = []string{"semaphore", "rwlock", "election", "observe", "complete", "watch", "check_token", "multilock", "max_hold"}

// do serves one request.
func (d *driver) do(r request) (map[string]any, error) {
	switch r.Op {
	case "hello":
		return map[string]any{"client": "go", "version": version, "capabilities": capabilities}, nil
	case "open_session":
		return d.openSession(r)
	case "close_session":
		s, err := d.session(r.Session)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return nil, s.Close(ctx)
	case "session_deadline":
		s, err := d.session(r.Session)
		if err != nil {
			return nil, err
		}
		dl := s.Deadline()
		if d.broken {
			dl = time.Now().Add(time.Hour)
		}
		if d.fromAnswer {
			d.mu.Lock()
			dl = d.answered[r.Session]
			d.mu.Unlock()
		}
		return map[string]any{"deadline": dl.UnixNano()}, nil
	case "lock", "try_lock", "semaphore", "rlock", "wlock":
		return d.acquire(r)
	case "multi_lock":
		return d.multiLock(r)
	case "lock_deadline":
		h, err := d.lock(r.Lock)
		if err != nil {
			return nil, err
		}
		if h.m == nil {
			return nil, fail("invalid", "lock %q is not a mutex", r.Lock)
		}
		return map[string]any{"deadline": h.m.Deadline().UnixNano()}, nil
	case "unlock":
		return nil, d.unlock(r)
	case "guarded":
		return d.guarded(r)
	case "check_token":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := d.c.CheckToken(ctx, r.Name, r.Token)
		if err != nil {
			return nil, err
		}
		return map[string]any{"valid": st.Current}, nil
	case "complete":
		h, err := d.lock(r.Lock)
		if err != nil {
			return nil, err
		}
		if h.m == nil {
			return nil, fail("invalid", "lock %q is not a mutex", r.Lock)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return nil, h.m.Complete(ctx, time.Duration(r.RetentionMs)*time.Millisecond)
	case "campaign":
		return d.campaign(r)
	case "resign":
		e, err := d.election(r.Election)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return nil, e.Resign(ctx)
	case "observe":
		return nil, d.observe(r)
	case "watch":
		return nil, d.watch(r)
	case "stop":
		name := r.Observe + r.Watch
		d.mu.Lock()
		cancel := d.streams[name]
		delete(d.streams, name)
		d.mu.Unlock()
		if cancel == nil {
			return nil, fail("not_found", "no observe or watch %q", name)
		}
		cancel()
		return nil, nil
	}
	return nil, fail("invalid", "unknown op %q", r.Op)
}

func (d *driver) openSession(r request) (map[string]any, error) {
	opts := []lockd.SessionOption{}
	if r.TTLMs > 0 {
		opts = append(opts, lockd.WithTTL(time.Duration(r.TTLMs)*time.Millisecond))
	}
	if r.Owner != "" {
		opts = append(opts, lockd.WithOwner(r.Owner))
	}
	if d.fromAnswer {
		// Called when a confirmation arrives: the broken rule counts the
		// lease from now, not from when the request left.
		ttl := time.Duration(r.TTLMs) * time.Millisecond
		opts = append(opts, lockd.WithDeadlineFunc(func(time.Time) {
			d.mu.Lock()
			d.answered[r.Session] = lease.ClientDeadline(time.Now(), ttl)
			d.mu.Unlock()
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := d.c.NewSession(ctx, opts...)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.sessions[r.Session] = s
	d.mu.Unlock()
	if !d.broken {
		go func() {
			<-s.Done()
			if errors.Is(s.Err(), lockd.ErrLeaseLost) {
				d.event(map[string]any{"event": "lease_lost", "session": r.Session})
			}
		}()
	}
	return map[string]any{"session_id": s.ID(), "owner": s.Owner()}, nil
}

func (d *driver) session(name string) (*lockd.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[name]
	if s == nil {
		return nil, fail("not_found", "no session %q", name)
	}
	return s, nil
}

func (d *driver) lock(name string) (*held, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.locks[name]
	if h == nil {
		return nil, fail("not_found", "no lock %q", name)
	}
	return h, nil
}

func (d *driver) election(name string) (*lockd.Election, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.elections[name]
	if e == nil {
		return nil, fail("not_found", "no election %q", name)
	}
	return e, nil
}

// acquire serves lock, try_lock, semaphore, rlock and wlock: a new handle
// under the name the suite chose, kept only when granted.
func (d *driver) acquire(r request) (map[string]any, error) {
	s, err := d.session(r.Session)
	if err != nil {
		return nil, err
	}
	ctx, cancel := timeout(r.TimeoutMs)
	defer cancel()
	h := &held{name: r.Name}
	try := r.Try || r.Op == "try_lock"
	var lockFn func(context.Context) error
	switch r.Op {
	case "lock", "try_lock":
		var opts []lockd.LockOption
		if r.MaxHoldMs > 0 {
			opts = append(opts, lockd.WithMaxHold(time.Duration(r.MaxHoldMs)*time.Millisecond))
		}
		h.m = s.NewMutex(r.Name, opts...)
		lockFn = h.m.Lock
		if try {
			lockFn = h.m.TryLock
		}
	case "semaphore":
		h.sem = s.NewSemaphore(r.Name, r.Permits)
		lockFn = h.sem.Lock
		if try {
			lockFn = h.sem.TryLock
		}
	case "rlock", "wlock":
		h.rw = s.NewRWMutex(r.Name)
		h.shared = r.Op == "rlock"
		switch {
		case h.shared && try:
			lockFn = h.rw.TryRLock
		case h.shared:
			lockFn = h.rw.RLock
		case try:
			lockFn = h.rw.TryLock
		default:
			lockFn = h.rw.Lock
		}
	}
	if err := lockFn(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.locks[r.Lock] = h
	d.mu.Unlock()
	return map[string]any{"token": h.token()}, nil
}

func (h *held) token() uint64 {
	switch {
	case h.m != nil:
		return h.m.Token()
	case h.sem != nil:
		return h.sem.Token()
	case h.ml != nil:
		return 0 // a set has one token per name: see guarded
	}
	return h.rw.Token()
}

func (h *held) err() error {
	switch {
	case h.m != nil:
		return h.m.Err()
	case h.sem != nil:
		return h.sem.Err()
	case h.ml != nil:
		if err := context.Cause(h.ml.Context()); err != nil {
			return err
		}
		if !time.Now().Before(h.ml.Deadline()) {
			return lockd.ErrLeaseLost
		}
		return nil
	}
	return h.rw.Err()
}

func (d *driver) unlock(r request) error {
	h, err := d.lock(r.Lock)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch {
	case h.m != nil:
		err = h.m.Unlock(ctx)
	case h.sem != nil:
		err = h.sem.Unlock(ctx)
	case h.ml != nil:
		err = h.ml.Unlock(ctx)
	case h.shared:
		err = h.rw.RUnlock(ctx)
	default:
		err = h.rw.Unlock(ctx)
	}
	d.mu.Lock()
	if d.locks[r.Lock] == h {
		delete(d.locks, r.Lock)
	}
	d.mu.Unlock()
	return err
}

// guarded answers whether the client would still act under the lock now:
// the lock's Err says so, and it ends strictly before the server may end
// the hold.
func (d *driver) guarded(r request) (map[string]any, error) {
	h, err := d.lock(r.Lock)
	if err != nil {
		return nil, err
	}
	if !d.broken {
		if err := h.err(); err != nil {
			return nil, fail("lease_lost", "%v", err)
		}
	}
	if h.ml != nil {
		return map[string]any{"tokens": h.ml.Tokens()}, nil
	}
	return map[string]any{"token": h.token()}, nil
}

func (d *driver) campaign(r request) (map[string]any, error) {
	s, err := d.session(r.Session)
	if err != nil {
		return nil, err
	}
	e := s.NewElection(r.Name)
	d.mu.Lock()
	d.elections[r.Election] = e
	d.mu.Unlock()
	ctx, cancel := timeout(r.TimeoutMs)
	defer cancel()
	if err := e.Campaign(ctx, []byte(r.Value)); err != nil {
		return nil, err
	}
	return map[string]any{"token": e.Token()}, nil
}

// observe starts leader events for the election on r.Name.
func (d *driver) observe(r request) error {
	ctx, cancel := context.WithCancel(context.Background())
	if !d.track(r.Observe, cancel) {
		return fail("already_held", "observe %q exists", r.Observe)
	}
	go func() {
		for l, err := range d.c.ObserveElection(ctx, r.Name) {
			if err != nil {
				if ctx.Err() == nil {
					logErr("observe", err)
				}
				return
			}
			d.event(map[string]any{"event": "leader", "observe": r.Observe, "value": string(l.Value), "token": l.Token})
		}
	}()
	return nil
}

// watch starts watch events for the locks under r.Prefix.
func (d *driver) watch(r request) error {
	ctx, cancel := context.WithCancel(context.Background())
	if !d.track(r.Watch, cancel) {
		return fail("already_held", "watch %q exists", r.Watch)
	}
	var opts []lockd.WatchOption
	if r.From != "" {
		opts = append(opts, lockd.WatchFrom(r.From))
	}
	go func() {
		for ev, err := range d.c.Watch(ctx, r.Prefix, opts...) {
			if err != nil && !errors.Is(err, lockd.ErrWatchReset) {
				if ctx.Err() == nil {
					logErr("watch", err)
				}
				return
			}
			d.event(map[string]any{"event": "watch", "watch": r.Watch, "kind": strings.ToLower(ev.Kind.String()),
				"name": ev.Name, "position": ev.Position, "token": ev.Token, "session_id": ev.Session})
		}
	}()
	return nil
}

// track records a stream handle, unless the name is taken.
func (d *driver) track(name string, cancel context.CancelFunc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.streams[name]; ok {
		cancel()
		return false
	}
	d.streams[name] = cancel
	return true
}

func logErr(what string, err error) {
	_, _ = os.Stderr.WriteString("godriver: " + what + ": " + err.Error() + "\n")
}
