package fsm

import (
	"crypto/subtle"
	"maps"
	"slices"
	"time"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// session is a client's lease on the cluster: its holds and waits, and the
// duplicate table of its requests (duplicate.go).
type session struct {
	id        string
	requestID string
	ttlMs     int64
	owner     string
	created   int64
	revoked   bool
	// secretHash is the SHA-256 of the session secret; empty for a session
	// from before secrets (restored from an old snapshot), which Apply
	// lets any secret use (the server refuses it in its handlers and a new
	// leader expires it). identity is who created it ("" with
	// authentication off).
	secretHash []byte
	identity   string
	// ack is the session's acknowledged floor: every table seq is at or
	// above it, and a request below it is answered only from a live wait or
	// hold (liveAcquire), else refused.
	ack     uint64
	results map[uint64]*fsmv1.Result // the duplicate table, by seq
	seqs    []uint64                 // the keys of results, ascending
	holds   map[string]*hold         // by lock name
	waits   map[string]*wait         // by lock name
}

func newSession(id, requestID, owner string, ttlMs, created int64, revoked bool, ack uint64) *session {
	return &session{id: id, requestID: requestID, ttlMs: ttlMs, owner: owner, created: created, revoked: revoked, ack: ack,
		results: map[uint64]*fsmv1.Result{}, holds: map[string]*hold{}, waits: map[string]*wait{}}
}

// used counts what the session holds toward MaxLocksPerSession: its holds,
// its waits and the completion marks it set that still live.
func (f *FSM) used(s *session) int {
	return len(s.holds) + len(s.waits) + f.counts.markedBy[s.id]
}

func (f *FSM) applyCreateSession(c *fsmv1.CreateSession) *Result {
	if f.clusterID == "" {
		return fail(CodeNotInitialized, "cluster not initialized yet")
	}
	if c.RequestId != "" {
		if id, ok := f.byRequest[c.RequestId]; ok {
			// A retry must present the same secret and identity: a request
			// id is no way into someone else's session.
			if r := f.authorize(id, c.SecretHash, c.Identity); r != nil {
				return r
			}
			found := f.sessions[id]
			return &Result{SessionID: id, Duplicate: true, TTL: time.Duration(found.ttlMs) * time.Millisecond, Secretless: len(found.secretHash) == 0}
		}
	}
	if err := ValidateCreateSession(c); err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	switch {
	case f.sessions[c.SessionId] != nil:
		return fail(CodeInvalid, "session id %s already exists", c.SessionId)
	case len(f.sessions) >= limits.sessions:
		return fail(CodeTooMany, "too many sessions (%d)", limits.sessions)
	case c.Identity != "" && c.IdentitySessionsCap > 0 && f.counts.byIdentity[c.Identity] >= int(c.IdentitySessionsCap):
		// Here rather than only on the leader before proposing: creations
		// proposed concurrently are counted one after another.
		return fail(CodeIdentityLimit, "identity %s has %d live sessions, its cap", c.Identity, c.IdentitySessionsCap)
	}
	s := newSession(c.SessionId, c.RequestId, c.Owner, c.TtlMs, c.TimeUnixNano, false, 1)
	s.secretHash, s.identity = c.SecretHash, c.Identity
	f.sessions[s.id] = s
	if s.identity != "" {
		f.counts.byIdentity[s.identity]++
	}
	if s.requestID != "" {
		f.byRequest[s.requestID] = s.id
	}
	f.sessionEvent(EventSessionCreated, s)
	return &Result{SessionID: s.id, TTL: time.Duration(s.ttlMs) * time.Millisecond}
}

// authorize refuses a command on session id unless it presents the
// session's secret hash and comes from the identity that created it; nil
// means go on (an unknown session is left to the command's own answer). It
// compares values carried in the log, so every replica decides the same.
func (f *FSM) authorize(id string, secretHash []byte, identity string) *Result {
	s := f.sessions[id]
	if s == nil {
		return nil
	}
	if len(s.secretHash) != 0 && subtle.ConstantTimeCompare(s.secretHash, secretHash) != 1 {
		return fail(CodeForbidden, "session %s: wrong or missing session secret", id)
	}
	if s.identity != "" && s.identity != identity {
		return fail(CodeForbidden, "session %s belongs to another identity", id)
	}
	return nil
}

func (f *FSM) applyCloseSession(c *fsmv1.CloseSession) *Result {
	if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
		return r
	}
	if s := f.sessions[c.SessionId]; s != nil {
		f.removeSession(s, c.TimeUnixNano, EventReleased)
	}
	return &Result{}
}

func (f *FSM) applyExpireSession(c *fsmv1.ExpireSession, term uint64) *Result {
	if c.Term != 0 && term != 0 && c.Term != term {
		// Decided by an earlier leadership and committed in a later one:
		// leases were restarted in full since, so the decision is stale.
		return fail(CodeInvalid, "stale expiry of session %s decided in term %d, committed in term %d", c.SessionId, c.Term, term)
	}
	r := &Result{}
	if s := f.sessions[c.SessionId]; s != nil {
		for _, h := range s.holds {
			r.HoldsGrantedAt = append(r.HoldsGrantedAt, time.Unix(0, h.granted))
		}
		slices.SortFunc(r.HoldsGrantedAt, time.Time.Compare)
		f.stats.Expired++
		end := EventExpired
		if c.Forced || s.revoked {
			// An operator ended it: now (--unsafe-now) or by revoking it
			// and letting its lease run out.
			end = EventForceReleased
		}
		f.removeSession(s, c.TimeUnixNano, end)
	}
	return r
}

func (f *FSM) applyRevokeSession(c *fsmv1.RevokeSession) *Result {
	for _, id := range c.SessionIds {
		if s := f.sessions[id]; s != nil && !s.revoked {
			s.revoked = true
			// A revoked session will never use a lock it waits for;
			// granting one would only keep it from others until expiry.
			f.dropWaits(s, c.TimeUnixNano)
			f.sessionEvent(EventSessionRevoked, s)
		}
	}
	return &Result{}
}

// dropWaits removes every queued wait of s, then grants what that frees, in
// lock-name order.
func (f *FSM) dropWaits(s *session, now int64) {
	waits := slices.Sorted(maps.Keys(s.waits))
	for _, name := range waits {
		f.removeWait(f.locks[name], s.waits[name])
	}
	for _, name := range waits {
		if l := f.locks[name]; l != nil {
			f.promote(l, now)
		}
	}
}

// removeSession releases every hold and drops every wait of s, then grants
// the next waiters of each affected lock, in lock-name order. end is the
// holds' event: EventReleased (closed), EventExpired or EventForceReleased.
// An expired or force-released holder of a lock with a lock-delay leaves
// the lock delayed instead.
func (f *FSM) removeSession(s *session, now int64, end EventKind) {
	// Sorted, so the events come in the same order on every replica.
	waits := slices.Sorted(maps.Keys(s.waits))
	holds := slices.Sorted(maps.Keys(s.holds))
	for _, name := range waits {
		f.removeWait(f.locks[name], s.waits[name])
	}
	for _, name := range holds {
		l, h := f.locks[name], s.holds[name]
		f.removeHold(l, h, end)
		if end != EventReleased && l.delayMs > 0 {
			f.startDelay(l, h)
		}
	}
	delete(f.sessions, s.id)
	if s.identity != "" {
		if f.counts.byIdentity[s.identity]--; f.counts.byIdentity[s.identity] <= 0 {
			delete(f.counts.byIdentity, s.identity)
		}
	}
	if s.requestID != "" {
		delete(f.byRequest, s.requestID)
	}
	for _, name := range slices.Compact(slices.Sorted(slices.Values(append(waits, holds...)))) {
		if l := f.locks[name]; l != nil {
			f.promote(l, now)
		}
	}
	f.sessionEvent(EventSessionRemoved, s)
}
