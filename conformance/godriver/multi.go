package main

// multiLock serves multi_lock: every lock of names taken at once with
// Session.NewMultiLock, kept under the handle only when granted.
func (d *driver) multiLock(r request) (map[string]any, error) {
	s, err := d.session(r.Session)
	if err != nil {
		return nil, err
	}
	for _, m := range r.Modes {
		if m != "exclusive" {
			return nil, fail("invalid", "multi_lock: mode %q: the Go client's multi-lock takes exclusive locks only", m)
		}
	}
	if len(r.Modes) != 0 && len(r.Modes) != len(r.Names) {
		return nil, fail("invalid", "multi_lock: %d modes for %d names", len(r.Modes), len(r.Names))
	}
	ctx, cancel := timeout(r.TimeoutMs)
	defer cancel()
	ml := s.NewMultiLock(r.Names)
	lockFn := ml.Lock
	if r.Try {
		lockFn = ml.TryLock
	}
	if err := lockFn(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.locks[r.Lock] = &held{name: r.Names[0], ml: ml}
	d.mu.Unlock()
	return map[string]any{"tokens": ml.Tokens()}, nil
}
