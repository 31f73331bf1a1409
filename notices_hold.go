package lockd

// The handles' side of release-request notices (notices.go): a lock or a
// MultiLock registers with the client's hub while it acquires or holds,
// keeps a notice that came before its grant was installed, and delivers
// each notice at most once per hold and grace state.

// notedHold is the last hold a handle was notified for, and whether that
// notice carried a revoke grace.
type notedHold struct {
	token  uint64
	graced bool
}

// wants reports whether r, for the current hold, is news: the hold's first
// notice, or its first one with a revoke grace.
func (n notedHold) wants(r ReleaseRequest) bool {
	return r.Token != n.token || (r.RevokeGrace > 0 && !n.graced)
}

// later reports whether early notice r should replace the kept one e.
func later(e *ReleaseRequest, r ReleaseRequest) bool {
	return e == nil || r.Token > e.Token || (r.Token == e.Token && e.RevokeGrace == 0)
}

// releaseRequested returns l's notice channel; the hub knows l from then
// on while l acquires or holds.
func (l *lock) releaseRequested() <-chan ReleaseRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.notes == nil {
		l.notes = make(chan ReleaseRequest, 1)
		if l.h != nil || l.busy {
			l.track()
			l.s.c.notices.readAgain(l)
		}
	}
	return l.notes
}

// track makes the hub deliver l's notices (an acquire starts). l.mu is
// held.
func (l *lock) track() {
	if l.notes != nil && !l.tracked {
		l.tracked = true
		l.s.c.notices.add(l)
	}
}

// untrack is track's end (the hold ended, the acquire failed): an unread
// notice leaves the channel. l.mu is held.
func (l *lock) untrack() {
	if l.tracked {
		l.tracked = false
		l.s.c.notices.remove(l)
	}
	drain(l.notes)
	l.early = nil
}

// notify delivers r to l's channel when it concerns l's current hold and
// is news for it; a notice for a grant not installed yet is kept until it
// is.
func (l *lock) notify(r ReleaseRequest) {
	if r.Name != l.name {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		if l.busy && r.Token > l.noted.token && later(l.early, r) {
			l.early = &r
		}
		return
	}
	if l.h.token != r.Token || !l.noted.wants(r) {
		return
	}
	l.noted = notedHold{r.Token, r.RevokeGrace > 0}
	sendLatest(l.notes, r)
}

// drain empties ch (buffered 1; nil: nothing).
func drain(ch chan ReleaseRequest) {
	select {
	case <-ch:
	default:
	}
}

// sendLatest puts r in ch (buffered 1), replacing an unread one.
func sendLatest(ch chan ReleaseRequest, r ReleaseRequest) {
	drain(ch)
	ch <- r
}

func (l *lock) noticeSession() *Session { return l.s }
func (l *lock) noticeNames() []string   { return []string{l.name} }

// noticeGranted is granted's part: a stale notice leaves the channel and
// one that came before the grant was installed is delivered. l.mu is held.
func (l *lock) noticeGranted() {
	if l.notes == nil {
		return
	}
	drain(l.notes)
	if e := l.early; e != nil && e.Token == l.h.token && l.noted.wants(*e) {
		l.noted = notedHold{e.Token, e.RevokeGrace > 0}
		l.notes <- *e
	}
	l.early = nil
}

// ReleaseRequested returns a channel that receives a ReleaseRequest when
// someone asks one lock of the held set to let go (its Name and Token say
// which), once per lock and hold (and once more when an admin's request
// starts a revoke grace), as Mutex.ReleaseRequested. The channel holds
// one: a request for another lock of the set replaces one not read yet,
// so read it as "the set was asked to let go", and release the set.
func (m *MultiLock) ReleaseRequested() <-chan ReleaseRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.notes == nil {
		m.notes, m.noted = make(chan ReleaseRequest, 1), map[string]notedHold{}
		if m.h != nil || m.busy {
			m.track()
			m.s.c.notices.readAgain(m)
		}
	}
	return m.notes
}

// track and untrack are lock's, for the set. m.mu is held.
func (m *MultiLock) track() {
	if m.notes != nil && !m.tracked {
		m.tracked = true
		m.s.c.notices.add(m)
	}
}

func (m *MultiLock) untrack() {
	if m.tracked {
		m.tracked = false
		m.s.c.notices.remove(m)
	}
	drain(m.notes)
	m.early = nil
}

func (m *MultiLock) noticeSession() *Session { return m.s }
func (m *MultiLock) noticeNames() []string   { return m.names }

func (m *MultiLock) notify(r ReleaseRequest) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.notes == nil {
		return
	}
	if m.h == nil {
		if !m.busy || r.Token <= m.noted[r.Name].token {
			return
		}
		if e, ok := m.early[r.Name]; !ok || later(&e, r) {
			if m.early == nil {
				m.early = map[string]ReleaseRequest{}
			}
			m.early[r.Name] = r
		}
		return
	}
	if m.h.tokens[r.Name] != r.Token || !m.noted[r.Name].wants(r) {
		return
	}
	m.noted[r.Name] = notedHold{r.Token, r.RevokeGrace > 0}
	sendLatest(m.notes, r)
}

// noticeGranted is lock.noticeGranted for the set. m.mu is held.
func (m *MultiLock) noticeGranted() {
	if m.notes == nil {
		return
	}
	drain(m.notes)
	for _, n := range m.names {
		if e, ok := m.early[n]; ok && e.Token == m.h.tokens[n] && m.noted[n].wants(e) {
			m.noted[n] = notedHold{e.Token, e.RevokeGrace > 0}
			sendLatest(m.notes, e)
		}
	}
	m.early = nil
}
