package fsm

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A Raft snapshot is encoded straight from the state, lock by lock, under
// the read lock, instead of first copying the whole state into messages
// (State) and then marshalling them: for a node with 1 000 000 locks the
// copy was about 270 MB of short-lived messages per snapshot, on top of
// the encoding and a second copy of it with the version byte, so the
// process peaked far above the state's own size. The bytes are the same as
// EncodeSnapshot(State()) with the applied index set (TestEncodeLocked and
// the property test compare them): fields in number order, each lock a
// field-5 record.

// lastSnapshotBytes sizes the next encoding's buffer: the previous one's
// size and an eighth more, so the buffer is not regrown (and copied) as
// it fills. One per process (a node has one FSM); with several FSMs in
// one process (tests) it is only a capacity hint.
var lastSnapshotBytes atomic.Int64

// snapshotFieldLocks is fsmv1.Snapshot's locks field number.
const snapshotFieldLocks = 5

// encodeLocked returns the state's snapshot encoding, the applied index
// included; f.mu is held (read or write).
func (f *FSM) encodeLocked() ([]byte, error) {
	hint := lastSnapshotBytes.Load()
	buf := make([]byte, 1, hint+hint/8+64)
	buf[0] = snapshotVersion
	opts := proto.MarshalOptions{Deterministic: true}
	cached := proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
	// Fields 1 to 4: everything before the locks. Sessions are few
	// (bounded by the session cap) and carry the duplicate tables.
	head := &fsmv1.Snapshot{ClusterId: f.clusterID, Epoch: f.epoch, LastToken: f.lastToken, Sessions: f.sessionsLocked()}
	buf, err := opts.MarshalAppend(buf, head)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	// Field 5, one record per lock in name order, from one reused message.
	var pl fsmv1.Lock
	pool := lockMsgPool{reuse: true}
	f.names.Ascend(func(l *lock) bool {
		pool.fill(&pl, l)
		buf = protowire.AppendTag(buf, snapshotFieldLocks, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(opts.Size(&pl)))
		buf, err = cached.MarshalAppend(buf, &pl)
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	// Fields 6 to 9.
	tail := &fsmv1.Snapshot{Members: f.membersLocked(), AppliedIndex: f.applied, Policies: f.statePolicies(), ClusterVersion: f.clusterVersion}
	if buf, err = opts.MarshalAppend(buf, tail); err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	lastSnapshotBytes.Store(int64(len(buf)))
	return buf, nil
}

// sessionsLocked returns the sessions' messages, by id; f.mu is held.
func (f *FSM) sessionsLocked() []*fsmv1.Session {
	var out []*fsmv1.Session
	for _, s := range f.sessions {
		ps := &fsmv1.Session{Id: s.id, RequestId: s.requestID, TtlMs: s.ttlMs, Owner: s.owner, CreatedUnixNano: s.created, Revoked: s.revoked, Ack: s.ack, SecretHash: s.secretHash, Identity: s.identity}
		for _, seq := range s.seqs {
			ps.Results = append(ps.Results, proto.CloneOf(s.results[seq]))
		}
		out = append(out, ps)
	}
	slices.SortFunc(out, func(a, b *fsmv1.Session) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// membersLocked returns the members' messages, by node id; f.mu is held.
func (f *FSM) membersLocked() []*fsmv1.MemberInfo {
	var out []*fsmv1.MemberInfo
	for _, m := range f.members {
		out = append(out, &fsmv1.MemberInfo{NodeId: m.ID, ApiUrl: m.API, RaftAddress: m.Raft, NonVoter: m.NonVoter})
	}
	slices.SortFunc(out, func(a, b *fsmv1.MemberInfo) int { return strings.Compare(a.NodeId, b.NodeId) })
	return out
}

// lockMsgPool hands out Hold and Wait messages for fill to reuse from one
// lock to the next; its zero value allocates afresh (State's copies must
// not share messages).
type lockMsgPool struct {
	reuse bool
	holds []*fsmv1.Hold // the messages
	waits []*fsmv1.Wait
	hs    []*fsmv1.Hold // the last lock's Holders, for its backing array
	ws    []*fsmv1.Wait
}

// fill sets pl to lock l's message (what a snapshot records of it).
func (p *lockMsgPool) fill(pl *fsmv1.Lock, l *lock) {
	var (
		holders []*fsmv1.Hold
		queue   []*fsmv1.Wait
	)
	if p.reuse {
		holders, queue = p.hs[:0], p.ws[:0]
	}
	pl.Reset()
	pl.Name, pl.Limit, pl.LockDelayMs, pl.Delayed, pl.DelayToken = l.name, l.limit, l.delayMs, l.delayed, l.delayToken
	for i, h := range l.holders {
		var ph *fsmv1.Hold
		if !p.reuse {
			ph = &fsmv1.Hold{}
		} else {
			if i == len(p.holds) {
				p.holds = append(p.holds, &fsmv1.Hold{})
			}
			ph = p.holds[i]
			ph.Reset()
		}
		ph.SessionId, ph.Mode, ph.Token, ph.Seq, ph.Value, ph.GrantedUnixNano, ph.MaxHoldMs = h.session, h.mode, h.token, h.seq, valueBytes(h.value), h.granted, h.maxHoldMs
		if a := h.ask; a != nil {
			ph.Asked, ph.AskedUnixNano, ph.AskedReason, ph.RevokeGraceMs, ph.GraceUnixNano = true, a.at, a.reason, a.graceMs, a.graceAt
		}
		holders = append(holders, ph)
	}
	for i, w := range l.queue {
		var pw *fsmv1.Wait
		if !p.reuse {
			pw = &fsmv1.Wait{}
		} else {
			if i == len(p.waits) {
				p.waits = append(p.waits, &fsmv1.Wait{})
			}
			pw = p.waits[i]
			pw.Reset()
		}
		pw.SessionId, pw.Mode, pw.Seq, pw.Value, pw.QueuedUnixNano, pw.MaxHoldMs, pw.SetSize = w.session, w.mode, w.seq, valueBytes(w.value), w.queued, w.maxHoldMs, setSize(w)
		queue = append(queue, pw)
	}
	if p.reuse {
		p.hs, p.ws = holders, queue
	}
	if len(holders) > 0 {
		pl.Holders = holders
	}
	if len(queue) > 0 {
		pl.Queue = queue
	}
	if m := l.mark; m != nil {
		pl.Mark = &fsmv1.Mark{SessionId: m.session, Owner: m.owner, Token: m.token, CompletedUnixNano: m.completed, RetentionMs: m.retentionMs}
	}
}
