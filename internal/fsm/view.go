package fsm

import (
	"slices"
	"strings"
	"time"
)

// Read views: copies of the state for the server, in time.Duration and
// time.Time (the log and snapshots keep integers). Each takes the read lock.

// HolderInfo describes one hold.
type HolderInfo struct {
	// Session is the holding session's id.
	Session string
	// Owner is the holding session's owner.
	Owner string
	// Mode is ModeExclusive or ModeShared.
	Mode int32
	// Token is the grant's fencing token.
	Token uint64
	// Seq is the seq of the acquire that was granted.
	Seq uint64
	// Value is the acquire's value.
	Value []byte
	// GrantedAt is when (the proposer's wall clock; display only).
	GrantedAt time.Time
	// MaxHold is the hold's budget (0: none).
	MaxHold time.Duration
	// ReleaseRequestedAt is when the hold was first asked to let go (zero:
	// never), ReleaseReason why, and RevokeGrace the grace after which its
	// session is revoked (0: none).
	ReleaseRequestedAt time.Time
	ReleaseReason      string
	RevokeGrace        time.Duration
	// RevokeGraceFrom is when the admin's request that started the grace
	// was made.
	RevokeGraceFrom time.Time
}

// WaiterInfo describes one queued request.
type WaiterInfo struct {
	// Session is the waiting session's id.
	Session string
	// Owner is the waiting session's owner.
	Owner string
	// Mode is ModeExclusive or ModeShared.
	Mode int32
	// Seq is the seq of the queued acquire.
	Seq uint64
	// QueuedAt is when (the proposer's wall clock; display only).
	QueuedAt time.Time
}

// LockInfo describes a lock.
type LockInfo struct {
	// Name is the lock's name.
	Name string
	// Limit is the most shared holders (0: unbounded).
	Limit uint32
	// Holders are in token order.
	Holders []HolderInfo
	// Waiters are in queue order.
	Waiters []WaiterInfo
	// Mark is the completion mark, nil for none.
	Mark *Mark
	// Delay is the lock-delay after an expired holder (0: none).
	Delay time.Duration
	// Delayed reports that a lock-delay runs: nothing is granted.
	Delayed bool
}

func (f *FSM) holderInfos(l *lock) []HolderInfo {
	out := make([]HolderInfo, len(l.holders))
	for i, h := range l.holders {
		out[i] = HolderInfo{Session: h.session, Owner: f.ownerOf(h.session), Mode: h.mode, Token: h.token, Seq: h.seq, Value: valueBytes(h.value), GrantedAt: time.Unix(0, h.granted), MaxHold: ms(h.maxHoldMs)}
		if a := h.ask; a != nil {
			out[i].ReleaseRequestedAt, out[i].ReleaseReason, out[i].RevokeGrace = time.Unix(0, a.at), a.reason, ms(a.graceMs)
			if a.graceMs > 0 {
				out[i].RevokeGraceFrom = time.Unix(0, a.graceAt)
			}
		}
	}
	return out
}

func (f *FSM) ownerOf(id string) string {
	if s := f.sessions[id]; s != nil {
		return s.owner
	}
	return ""
}

func (f *FSM) lockInfo(l *lock) LockInfo {
	li := LockInfo{Name: l.name, Limit: l.limit, Holders: f.holderInfos(l), Waiters: make([]WaiterInfo, len(l.queue)), Delay: time.Duration(l.delayMs) * time.Millisecond, Delayed: l.delayed}
	if l.mark != nil {
		li.Mark = l.mark.view()
	}
	for i, w := range l.queue {
		li.Waiters[i] = WaiterInfo{Session: w.session, Owner: f.ownerOf(w.session), Mode: w.mode, Seq: w.seq, QueuedAt: time.Unix(0, w.queued)}
	}
	return li
}

// Describe returns the lock named name, or false when it does not exist.
func (f *FSM) Describe(name string) (LockInfo, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l := f.locks[name]
	if l == nil {
		return LockInfo{}, false
	}
	return f.lockInfo(l), true
}

// List returns up to n locks whose names start with prefix and sort after
// after, in name order, and whether more remain. It costs O(log N + n)
// under the read lock, whatever the table's size: the name index starts at
// the page and stops at its end or where the prefix's range ends.
func (f *FSM) List(prefix, after string, n int) ([]LockInfo, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	from := max(prefix, after) // names with the prefix are one range, from the prefix on
	out := make([]LockInfo, 0, min(n, 64))
	more := false
	f.ascendFrom(from, func(l *lock) bool {
		if !strings.HasPrefix(l.name, prefix) {
			return false
		}
		if l.name == after {
			return true
		}
		if len(out) == n {
			more = true
			return false
		}
		out = append(out, f.lockInfo(l))
		return true
	})
	return out, more
}

// CheckToken reports whether token is a current grant of lock name.
func (f *FSM) CheckToken(name string, token uint64) (HolderInfo, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l := f.locks[name]
	if l == nil {
		return HolderInfo{}, false
	}
	for _, h := range l.holders {
		if h.token == token {
			return HolderInfo{Session: h.session, Mode: h.mode, Token: h.token, Seq: h.seq}, true
		}
	}
	return HolderInfo{}, false
}

// WaitState tells what became of the acquire (session, name, seq): granted
// (with its token and hold budget), still queued (with its 1-based
// position), or neither.
func (f *FSM) WaitState(sessionID, name string, seq uint64) (status int, token uint64, position uint32, maxHold time.Duration) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return 0, 0, 0, 0
	}
	if h := s.holds[name]; h != nil && h.seq == seq {
		return StatusGranted, h.token, 0, ms(h.maxHoldMs)
	}
	if w := s.waits[name]; w != nil && w.seq == seq {
		l := f.locks[name]
		return StatusQueued, 0, uint32(slices.Index(l.queue, w) + 1), 0
	}
	return 0, 0, 0, 0
}

// SessionInfo describes a session.
type SessionInfo struct {
	// ID is the session's id.
	ID string
	// Owner is who created it (for people).
	Owner string
	// TTL is the session's lease.
	TTL time.Duration
	// CreatedAt is when (the proposer's wall clock; display only).
	CreatedAt time.Time
	// Holds counts the locks it holds.
	Holds int
	// Waits counts the locks it waits for.
	Waits int
	// Revoked reports that it was force-released.
	Revoked bool
	// Identity is who created it ("" with authentication off). The secret
	// and its hash are never part of a view.
	Identity string
	// Secretless reports a session without a secret hash: restored from a
	// snapshot written before session secrets, it would accept any secret,
	// so a new leader revokes it (the server's promoteTimers).
	Secretless bool
}

// Session returns the session with id, or false.
func (f *FSM) Session(id string) (SessionInfo, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[id]
	if s == nil {
		return SessionInfo{}, false
	}
	return sessionInfo(s), true
}

func sessionInfo(s *session) SessionInfo {
	return SessionInfo{ID: s.id, Owner: s.owner, TTL: time.Duration(s.ttlMs) * time.Millisecond, CreatedAt: time.Unix(0, s.created), Holds: len(s.holds), Waits: len(s.waits), Revoked: s.revoked, Identity: s.identity, Secretless: len(s.secretHash) == 0}
}

// SessionAuth returns what a call on session id must match, for checks
// outside Apply (KeepAlive is not a log command): the secret's SHA-256
// (empty: any secret) and the creating identity ("" : any).
func (f *FSM) SessionAuth(id string) (secretHash []byte, identity string, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[id]
	if s == nil {
		return nil, "", false
	}
	return s.secretHash, s.identity, true
}

// SessionsOf returns how many live sessions identity created.
func (f *FSM) SessionsOf(identity string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.counts.byIdentity[identity]
}

// Sessions returns all sessions ordered by id.
func (f *FSM) Sessions() []SessionInfo {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]SessionInfo, 0, len(f.sessions))
	for _, s := range f.sessions {
		out = append(out, sessionInfo(s))
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Info is a summary of the state.
type Info struct {
	// ClusterID is "" before the Init command.
	ClusterID string
	// Epoch is the cluster's first token minus one.
	Epoch uint64
	// LastToken is the last token granted (the epoch before any grant).
	LastToken uint64
	// Sessions counts the live sessions.
	Sessions int
	// Locks counts the locks held, waited for, marked or delayed.
	Locks int
	// Marks counts the completion marks.
	Marks int
	// Stats counts what this replica applied since it started.
	Stats Stats
}

// Info returns a summary of the state.
func (f *FSM) Info() Info {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Info{ClusterID: f.clusterID, Epoch: f.epoch, LastToken: f.lastToken, Sessions: len(f.sessions), Locks: len(f.locks), Marks: f.counts.marks, Stats: f.stats}
}

// ClusterID returns the cluster id, "" before the Init command. It takes no
// lock: every API response carries it.
func (f *FSM) ClusterID() string { return *f.publicID.Load() }

// WithSessions calls fn with every session while no command can be applied,
// so fn sees a state that later events continue exactly (used to
// start the leader's lease timers without missing a session).
func (f *FSM) WithSessions(fn func([]SessionInfo)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]SessionInfo, 0, len(f.sessions))
	for _, s := range f.sessions {
		out = append(out, sessionInfo(s))
	}
	fn(out)
}

// SessionLocks returns the names of at most n locks a session holds and of
// at most n it waits for, each in name order.
func (f *FSM) SessionLocks(sessionID string, n int) (holding, waiting []string) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return nil, nil
	}
	return firstNames(s.holds, n), firstNames(s.waits, n)
}

// firstNames returns the n smallest keys of m, in order.
func firstNames[V any](m map[string]V, n int) []string {
	out := make([]string, 0, min(len(m), n+1))
	for k := range m {
		i, _ := slices.BinarySearch(out, k)
		if i >= n {
			continue
		}
		out = slices.Insert(out, i, k)
		if len(out) > n {
			out = out[:n]
		}
	}
	return out
}
