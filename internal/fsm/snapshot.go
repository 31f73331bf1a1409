package fsm

import (
	"crypto/sha256"
	"fmt"
	"io"

	"github.com/google/btree"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// snapshotVersion is the first byte of a snapshot; the rest is an
// fsmv1.Snapshot.
const snapshotVersion = 1

// State returns the whole state as a message, in a deterministic order
// (sessions by id, locks by name, holders by token, queues in FIFO order).
func (f *FSM) State() *fsmv1.Snapshot {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.stateLocked()
}

// stateLocked is State with f.mu held.
func (f *FSM) stateLocked() *fsmv1.Snapshot {
	snap := &fsmv1.Snapshot{ClusterId: f.clusterID, Epoch: f.epoch, LastToken: f.lastToken, ClusterVersion: f.clusterVersion, Sessions: f.sessionsLocked()}
	snap.Locks = make([]*fsmv1.Lock, 0, f.names.Len())
	var fresh lockMsgPool // every lock its own messages
	f.names.Ascend(func(l *lock) bool {
		pl := &fsmv1.Lock{}
		fresh.fill(pl, l)
		snap.Locks = append(snap.Locks, pl)
		return true // in name order already: no sort
	})
	snap.Members = f.membersLocked()
	snap.Policies = f.statePolicies()
	return snap
}

// Snapshot implements raft.FSM. The state is encoded under the read lock
// (snapshot_encode.go); the bytes are written later, concurrently with
// Apply. Unlike State (and so backups),
// it records the index of the last applied entry: a node that installs it
// can place its watch history's floor at once instead of at the next entry,
// which on an idle cluster may never come.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := f.encodeLocked() // snapshot_encode.go
	if err != nil {
		return nil, err
	}
	return &snapshot{b: b}, nil
}

// snapshot is an encoded snapshot, ready to write.
type snapshot struct{ b []byte }

// EncodeSnapshot returns snap in the snapshot format (a version byte and the
// deterministic protobuf encoding), as Persist writes it and RestoreBytes
// and the Restore command read it.
func EncodeSnapshot(snap *fsmv1.Snapshot) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, err
	}
	return append([]byte{snapshotVersion}, b...), nil
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.b); err != nil {
		sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release lets the encoding go as soon as Raft is done with it.
func (s *snapshot) Release() { s.b = nil }

// Restore implements raft.FSM: it replaces the whole state.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	return f.RestoreBytes(b)
}

// RestoreBytes replaces the state with an encoded snapshot (as written by
// Persist). On error the state is unchanged.
func (f *FSM) RestoreBytes(b []byte) error {
	st, applied, err := decodeSnapshotBytes(b) // snapshot_decode.go
	if err != nil {
		return err
	}
	f.load(st, applied)
	return nil
}

func unmarshalSnapshot(b []byte) (*fsmv1.Snapshot, error) {
	if len(b) == 0 || b[0] != snapshotVersion {
		return nil, fmt.Errorf("unknown snapshot format")
	}
	var snap fsmv1.Snapshot
	if err := proto.Unmarshal(b[1:], &snap); err != nil {
		return nil, fmt.Errorf("decode snapshot: %w", err)
	}
	return &snap, nil
}

// CheckBackup reports why the Restore command would refuse backup b (an
// encoded snapshot), or nil: it runs the very checks Apply runs on a
// Restore's snapshot, bounds and caps included, so `lockd serve --restore`
// refuses at start exactly the backups the cluster would refuse later.
// (Apply also refuses a Restore into a cluster with state, or without a
// cluster id or with too high an epoch: fields the server fills in.)
func CheckBackup(b []byte) error {
	_, err := decodeBackup(b)
	return err
}

// decodeBackup decodes and checks a backup for the Restore command.
func decodeBackup(b []byte) (*state, error) {
	snap, err := unmarshalSnapshot(b)
	if err != nil {
		return nil, err
	}
	st, err := decodeState(snap)
	if err != nil {
		return nil, err
	}
	if st.lastToken >= maxEpoch {
		// The restored cluster's epoch continues above it, and an epoch
		// this high would be refused by every later snapshot of it.
		return nil, fmt.Errorf("backup's last token %d is not below %d", st.lastToken, uint64(maxEpoch))
	}
	return st, nil
}

// Load replaces the state with snap after checking it is consistent.
//
// Load refuses a snapshot that breaks the safety invariants (an exclusive
// holder not alone, more shared holders than the limit, a token repeated or
// above the counter, a counter that could wrap) or a cap Apply enforces, so
// a corrupt or hostile snapshot cannot become the state that later grants
// are made from. A duplicate table beyond its cap or below its floor, as an
// older version could write, is trimmed the way Apply trims it.
func (f *FSM) Load(snap *fsmv1.Snapshot) error {
	st, err := decodeState(snap)
	if err != nil {
		return err
	}
	f.load(st, snap.AppliedIndex)
	return nil
}

// load installs a decoded, checked state whose last entry is applied (0:
// not known).
func (f *FSM) load(st *state, applied uint64) {
	f.mu.Lock()
	f.install(st)
	f.applied = applied
	if f.sink != nil {
		f.pending = nil
		if applied != 0 {
			// The next entry's events start after the snapshot's index:
			// readers reset now, not at the next write.
			f.restored = false
			f.sink.Reset(applied + 1)
		} else {
			// A snapshot without its index: the sink hears the index
			// with the next entry.
			f.restored = true
			f.sink.Reset(0)
		}
	}
	f.mu.Unlock()
}

// state is a decoded, checked snapshot, ready to install.
type state struct {
	clusterID        string
	epoch, lastToken uint64
	sessions         map[string]*session
	byRequest        map[string]string
	locks            map[string]*lock
	names            *btree.BTreeG[*lock] // locks by name (derived)
	members          map[string]Member
	policies         map[string]*policy
	counts           counts
	clusterVersion   uint32
}

func (f *FSM) install(st *state) {
	f.clusterID, f.epoch, f.lastToken = st.clusterID, st.epoch, st.lastToken
	id := st.clusterID
	f.publicID.Store(&id)
	f.sessions, f.byRequest, f.locks, f.names, f.members, f.policies, f.counts = st.sessions, st.byRequest, st.locks, st.names, st.members, st.policies, st.counts
	f.clusterVersion = st.clusterVersion
	if f.onVersion != nil && f.clusterVersion > 1 {
		f.onVersion(f.clusterVersion)
	}
}

// applyRestore loads a backup into a new cluster (one that has seen no Init)
// under the command's cluster id, with tokens continuing above both the
// backup's last token and the command's epoch. The backup's sessions keep
// their holds until their leases, restarted in full, run out: their old
// clients refuse the new cluster id, so the locks come free after TTL +
// grace, never earlier.
func (f *FSM) applyRestore(c *fsmv1.Restore) *Result {
	if f.clusterID != "" {
		return fail(CodeInvalid, "restore into a cluster that already has state")
	}
	if c.ClusterId == "" {
		return fail(CodeInvalid, "restore without cluster id")
	}
	if c.Epoch >= maxEpoch {
		return fail(CodeInvalid, "restore epoch %d is not below %d", c.Epoch, uint64(maxEpoch))
	}
	st, err := decodeBackup(c.Snapshot)
	if err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	st.clusterID = c.ClusterId
	st.epoch = max(c.Epoch, st.lastToken)
	st.lastToken = st.epoch
	st.members = map[string]Member{} // the old cluster's nodes are not ours
	// The cluster version is this cluster's (what its voters apply), not
	// the backup's.
	st.clusterVersion = f.clusterVersion
	f.install(st)
	f.restored, f.pending = f.sink != nil, nil
	return &Result{}
}

// decodeState checks snap and builds the state it describes.
func decodeState(snap *fsmv1.Snapshot) (*state, error) {
	size := func(sessions map[string]*session) { sizeHolds(snap.Locks, sessions) }
	return decodeStateLocks(snap, len(snap.Locks), size, func(yield func(*fsmv1.Lock) error) error {
		for _, pl := range snap.Locks {
			if err := yield(pl); err != nil {
				return err
			}
		}
		return nil
	})
}

// decodeStateLocks is decodeState with snap's n locks (snap.Locks is not
// read) given one after another by locks, which stops at yield's first
// error and returns it (snapshot_decode.go decodes them from the bytes
// one at a time). A message yielded is not kept. size sizes the sessions'
// holds maps (sizeHolds) before the locks are added.
func decodeStateLocks(snap *fsmv1.Snapshot, n int, size func(map[string]*session), locks func(yield func(*fsmv1.Lock) error) error) (*state, error) {
	if snap.Epoch >= maxEpoch || snap.LastToken >= maxLastToken || snap.LastToken < snap.Epoch {
		return nil, fmt.Errorf("snapshot: bad token counter %d for epoch %d", snap.LastToken, snap.Epoch)
	}
	sessions, byRequest, err := decodeSessions(snap.Sessions)
	if err != nil {
		return nil, err
	}
	size(sessions)
	// Maps sized up front: a restart of a node with 1 000 000 locks
	// otherwise spends much of its restore growing them.
	tokens := make([]uint64, 0, n)
	byName := make(map[string]*lock, n)
	names := newNames()
	cs := newCounts()
	// State writes locks sorted by name: while the names rise strictly,
	// none repeats, and the check needs no lookup in a map of a million.
	// The locks are indexed (byName, names) on a goroutine of their own
	// meanwhile; from the first name out of order on, they are indexed
	// here, each before the next one's check.
	sorted, i, prev := true, 0, ""
	idx := startIndexing(byName, names)
	defer idx.wait() // (after a panic too; it is called below)
	err = locks(func(pl *fsmv1.Lock) error {
		if sorted && i > 0 && pl.Name <= prev {
			sorted = false
			idx.wait()
		}
		i, prev = i+1, pl.Name
		if !sorted && byName[pl.Name] != nil {
			return fmt.Errorf("snapshot: duplicate lock %q", pl.Name)
		}
		l, err := decodeLock(pl, sessions, &tokens, snap.LastToken)
		if err != nil {
			return err
		}
		if sorted {
			idx.add(l)
		} else {
			byName[l.name] = l
			names.ReplaceOrInsert(l)
		}
		cs.add(l)
		return nil
	})
	idx.wait()
	if err != nil {
		return nil, err
	}
	if err := checkTokensOnce(tokens); err != nil {
		return nil, err
	}
	if err := checkStateCaps(snap, sessions, &cs); err != nil {
		return nil, err
	}
	if err := decodeGroups(sessions, byName); err != nil {
		return nil, err
	}
	members, err := decodeMembers(snap.Members)
	if err != nil {
		return nil, err
	}
	policies, err := decodePolicies(snap.Policies)
	if err != nil {
		return nil, err
	}
	return &state{clusterID: snap.ClusterId, epoch: snap.Epoch, lastToken: snap.LastToken,
		sessions: sessions, byRequest: byRequest, locks: byName, names: names, members: members, policies: policies, counts: cs, clusterVersion: snap.ClusterVersion}, nil
}

// decodeSessions checks and builds a snapshot's sessions (without holds or
// waits) and the create request ids that name them.
func decodeSessions(pss []*fsmv1.Session) (map[string]*session, map[string]string, error) {
	if len(pss) > limits.sessions {
		return nil, nil, fmt.Errorf("snapshot: %d sessions, more than %d", len(pss), limits.sessions)
	}
	sessions := make(map[string]*session, len(pss))
	byRequest := make(map[string]string, len(pss))
	for _, ps := range pss {
		if ps.Id == "" || sessions[ps.Id] != nil {
			return nil, nil, fmt.Errorf("snapshot: bad or duplicate session id %q", ps.Id)
		}
		if ps.TtlMs <= 0 {
			return nil, nil, fmt.Errorf("snapshot: session %q has ttl %d ms", ps.Id, ps.TtlMs)
		}
		if len(ps.SecretHash) != 0 && len(ps.SecretHash) != sha256.Size {
			return nil, nil, fmt.Errorf("snapshot: session %q: secret hash of %d bytes", ps.Id, len(ps.SecretHash))
		}
		s := newSession(ps.Id, ps.RequestId, ps.Owner, ps.TtlMs, ps.CreatedUnixNano, ps.Revoked, ps.Ack)
		s.secretHash, s.identity = ps.SecretHash, ps.Identity
		for i, r := range ps.Results {
			if r.Seq == 0 || i > 0 && r.Seq <= ps.Results[i-1].Seq {
				return nil, nil, fmt.Errorf("snapshot: session %q: duplicate answers not in seq order", ps.Id)
			}
			// Through store, as Apply adds them: an older version kept
			// answers below the floor or beyond the cap (a Cancel before
			// its Acquire); they are dropped as Apply would have.
			s.store(proto.CloneOf(r))
		}
		sessions[s.id] = s
		if s.requestID != "" {
			byRequest[s.requestID] = s.id
		}
	}
	return sessions, byRequest, nil
}

// sizeHolds sizes each session's holds map up front: growing 64 maps to
// 15 000 entries each rehashes them over and over.
func sizeHolds(pls []*fsmv1.Lock, sessions map[string]*session) {
	holds := make(map[string]int, len(sessions))
	for _, pl := range pls {
		for _, ph := range pl.Holders {
			holds[ph.SessionId]++
		}
	}
	for id, n := range holds {
		if s := sessions[id]; s != nil {
			s.holds = make(map[string]*hold, n)
		}
	}
}

// decodeLock checks and builds one lock of a snapshot, adding its holds and
// waits to their sessions and its tokens to tokens (the caller checks them
// for repeats once every lock is in).
func decodeLock(pl *fsmv1.Lock, sessions map[string]*session, tokens *[]uint64, lastToken uint64) (*lock, error) {
	if pl.LockDelayMs < 0 || pl.LockDelayMs > MaxLockDelayMs || pl.Delayed && (pl.LockDelayMs == 0 || pl.DelayToken == 0) || !pl.Delayed && pl.DelayToken != 0 {
		return nil, fmt.Errorf("snapshot: lock %q: bad lock-delay", pl.Name)
	}
	l := &lock{name: pl.Name, limit: pl.Limit, delayMs: pl.LockDelayMs, delayed: pl.Delayed, delayToken: pl.DelayToken}
	if err := l.decodeHolders(pl, sessions, tokens, lastToken); err != nil {
		return nil, err
	}
	for _, pw := range pl.Queue {
		s := sessions[pw.SessionId]
		if s == nil || l.has(s, pw.SessionId) {
			return nil, fmt.Errorf("snapshot: lock %q: bad waiter %q", pl.Name, pw.SessionId)
		}
		if !validMode(pw.Mode) {
			return nil, fmt.Errorf("snapshot: lock %q: waiter %q has mode %d", pl.Name, pw.SessionId, pw.Mode)
		}
		if checkHoldMs("", pw.MaxHoldMs) != nil {
			return nil, fmt.Errorf("snapshot: lock %q: waiter %q: %w", pl.Name, pw.SessionId, errBadBudget)
		}
		w := &wait{session: s.id, mode: pw.Mode, seq: pw.Seq, value: string(pw.Value), queued: pw.QueuedUnixNano, maxHoldMs: pw.MaxHoldMs, setSize: pw.SetSize}
		l.queue = append(l.queue, w)
		s.waits[l.name] = w
	}
	if pm := pl.Mark; pm != nil {
		switch {
		case len(l.holders) > 0 || len(l.queue) > 0:
			return nil, fmt.Errorf("snapshot: lock %q has a completion mark and holders or waiters", pl.Name)
		case pm.Token == 0 || pm.Token > lastToken || pm.RetentionMs <= 0:
			return nil, fmt.Errorf("snapshot: lock %q: bad completion mark", pl.Name)
		}
		l.mark = &mark{session: pm.SessionId, owner: pm.Owner, token: pm.Token, completed: pm.CompletedUnixNano, retentionMs: pm.RetentionMs}
	}
	switch {
	case !l.delayed && len(l.queue) > 0 && l.queue[0].setSize == 0 && l.grantable(l.queue[0].mode):
		// Apply never leaves a head waiter that fits: it would wait on a
		// lock nothing will ever release.
		return nil, fmt.Errorf("snapshot: lock %q: head waiter could be granted", pl.Name)
	case l.empty():
		return nil, fmt.Errorf("snapshot: lock %q is empty", pl.Name)
	case len(l.queue) > limits.waiters:
		return nil, fmt.Errorf("snapshot: lock %q has %d waiters, more than %d", pl.Name, len(l.queue), limits.waiters)
	}
	return l, nil
}

// decodeHolders checks and adds the holders of pl to l and their sessions.
func (l *lock) decodeHolders(pl *fsmv1.Lock, sessions map[string]*session, tokens *[]uint64, lastToken uint64) error {
	for i, ph := range pl.Holders {
		s := sessions[ph.SessionId]
		if s == nil || l.has(s, ph.SessionId) {
			return fmt.Errorf("snapshot: lock %q: bad holder %q", pl.Name, ph.SessionId)
		}
		switch {
		case !validMode(ph.Mode):
			return fmt.Errorf("snapshot: lock %q: holder %q has mode %d", pl.Name, ph.SessionId, ph.Mode)
		case ph.Mode != pl.Holders[0].Mode || ph.Mode == ModeExclusive && i > 0:
			return fmt.Errorf("snapshot: lock %q: exclusive holder not alone", pl.Name)
		case pl.Limit > 0 && uint32(i) >= pl.Limit:
			return fmt.Errorf("snapshot: lock %q: more holders than its limit %d", pl.Name, pl.Limit)
		case ph.Token == 0 || ph.Token > lastToken:
			return fmt.Errorf("snapshot: lock %q: bad or repeated token %d", pl.Name, ph.Token)
		case i > 0 && ph.Token < pl.Holders[i-1].Token:
			return fmt.Errorf("snapshot: lock %q: holders not in token order", pl.Name)
		case checkHoldMs("", ph.MaxHoldMs) != nil:
			return fmt.Errorf("snapshot: lock %q: holder %q: %w", pl.Name, ph.SessionId, errBadBudget)
		case checkAsk(ph) != nil:
			return fmt.Errorf("snapshot: lock %q: holder %q: %w", pl.Name, ph.SessionId, checkAsk(ph))
		}
		*tokens = append(*tokens, ph.Token)
		// The session's own id string, not the decoded copy: a million
		// holds then keep 64 strings alive, not a million.
		h := &hold{session: s.id, mode: ph.Mode, token: ph.Token, seq: ph.Seq, value: string(ph.Value), granted: ph.GrantedUnixNano, maxHoldMs: ph.MaxHoldMs}
		if ph.Asked {
			h.ask = &holdAsk{at: ph.AskedUnixNano, reason: ph.AskedReason, graceMs: ph.RevokeGraceMs, graceAt: ph.GraceUnixNano}
		}
		l.holders = append(l.holders, h)
		s.holds[l.name] = h
	}
	return nil
}

// checkStateCaps checks the caps Apply enforces, which hold in any state it
// made, so a snapshot beyond them is not one of ours; it counts each
// identity's sessions into cs on the way.
func checkStateCaps(snap *fsmv1.Snapshot, sessions map[string]*session, cs *counts) error {
	switch {
	case cs.marks > limits.marks:
		return fmt.Errorf("snapshot: %d completion marks, more than %d", cs.marks, limits.marks)
	case cs.delayLocks > limits.delayLocks:
		return fmt.Errorf("snapshot: %d locks with a lock-delay, more than %d", cs.delayLocks, limits.delayLocks)
	case len(snap.Members) > limits.members:
		return fmt.Errorf("snapshot: %d members, more than %d", len(snap.Members), limits.members)
	}
	for _, ps := range snap.Sessions { // in order: the message is part of the answer
		s := sessions[ps.Id]
		if s.identity != "" {
			cs.byIdentity[s.identity]++
		}
		if n := len(s.holds) + len(s.waits) + cs.markedBy[s.id]; n > limits.locksPerSession {
			return fmt.Errorf("snapshot: session %q holds, waits for or marked %d locks, more than %d", s.id, n, limits.locksPerSession)
		}
	}
	return nil
}
