// Package fsm is lockd's deterministic lock table: sessions, locks, holders,
// FIFO wait queues and fencing tokens, changed only by Raft log commands.
//
// Apply never reads a clock and never compares times: anything that ends by
// time ends by a command the leader proposes. Every iteration that can assign
// a token runs in a sorted order, so all replicas grant the same tokens. See
// DESIGN.md in this folder for the invariants.
package fsm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/hashicorp/raft"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Code is the outcome of a command. Codes are stored in snapshots (duplicate
// table), so values are never reused.
type Code int32

// Outcomes of commands.
const (
	OK                 Code = 0
	CodeInvalid        Code = 1
	CodeSessionUnknown Code = 2
	CodeBusy           Code = 3
	CodeAlreadyHeld    Code = 4
	CodeNotHeld        Code = 5
	CodeLimitMismatch  Code = 6
	CodeRevoked        Code = 7
	CodeNotInitialized Code = 8
	CodeCancelled      Code = 9
	CodeTooMany        Code = 10
	CodeAlreadyDone    Code = 11
	// CodeForbidden: the command did not present the session's secret, or
	// came from another identity than the session's.
	CodeForbidden Code = 12
	// CodeIdentityLimit: the identity is at its cap of live sessions
	// (CreateSession.identity_sessions_cap).
	CodeIdentityLimit Code = 13
	// CodeDeadlock: the acquire would wait, and its wait would close a
	// cycle of sessions waiting for each other (deadlock.go).
	CodeDeadlock Code = 14
)

// Mode values, the same numbers as lockd.v1.Mode.
const (
	ModeExclusive int32 = 1
	ModeShared    int32 = 2
)

// Status of an acquire.
const (
	StatusGranted = 1
	StatusQueued  = 2
)

// Result is what Apply returns for a command (raft ApplyFuture.Response).
type Result struct {
	// Code is OK or why the command was refused.
	Code Code
	// Msg is for people, set with a non-OK code.
	Msg string

	// Status is, for an acquire, StatusGranted or StatusQueued.
	Status int
	// Token is, for a granted acquire, the grant's fencing token.
	Token uint64
	// MaxHold is, for a granted acquire, the hold's budget (0: none); for a
	// RequestRelease, the revoke grace it started on at least one hold (0:
	// none started).
	MaxHold time.Duration
	// Tokens are, for a granted AcquireMany, one per lock in name order
	// (Token is the first).
	Tokens []uint64
	// Position is, for a queued acquire, its 1-based queue position.
	Position uint32
	// Released reports, for a cancel, that a raced grant was released.
	Released bool
	// SessionID is, for a create session, the session's id.
	SessionID string
	// Holders are, for CodeBusy, the lock's holders; for RequestRelease,
	// the holds asked.
	Holders []HolderInfo
	// Mark is, for CodeAlreadyDone, the lock's completion mark.
	Mark *Mark
	// Duplicate reports that the answer came from the duplicate table (or,
	// for a repeated acquire, from its live wait or hold).
	Duplicate bool

	// What Apply knew when it answered, so the server need not read the
	// state again around the proposal. Local to each node (never in the
	// log, a snapshot or the duplicate table), and read from the state and
	// the command only.

	// TTL is, for a create session, the session's lease (for a repeat, the
	// lease of the session it found).
	TTL time.Duration
	// Secretless reports, for a repeated create session, that the session
	// it found has no secret hash (restored from an old backup).
	Secretless bool
	// QueuedAt is, for an acquire whose request waits in the queue (queued
	// by this command or by its first attempt), when it was queued (the
	// proposer's wall clock).
	QueuedAt time.Time
	// Delayed reports, for an acquire not granted, that a lock-delay runs
	// on the lock.
	Delayed bool
	// GrantedAt is, for a release or complete that ended a hold (not a
	// repeat), when that hold was granted (the proposer's wall clock).
	GrantedAt time.Time
	// HoldsGrantedAt is, for an expiry, when each hold it ended was
	// granted, in time order.
	HoldsGrantedAt []time.Time
}

// Err returns nil for OK, else an *Error with the code and message.
func (r *Result) Err() error {
	if r.Code == OK {
		return nil
	}
	return &Error{Code: r.Code, Msg: r.Msg}
}

// Error is a refused command.
type Error struct {
	// Code is why.
	Code Code
	// Msg is for people.
	Msg string
}

// Error returns the message.
func (e *Error) Error() string { return e.Msg }

func fail(c Code, format string, args ...any) *Result {
	return &Result{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// Stats counts what Apply did, for metrics and tests.
type Stats struct {
	// Grants counts all grants.
	Grants uint64
	// QueueGrants counts grants to a queued waiter.
	QueueGrants uint64
	// Expired counts sessions expired.
	Expired uint64
}

// FSM is the replicated state machine. It implements raft.FSM and
// raft.BatchingFSM. Its read methods are safe to call concurrently with Apply.
type FSM struct {
	mu        sync.RWMutex
	clusterID string
	epoch     uint64
	lastToken uint64
	sessions  map[string]*session
	byRequest map[string]string // create request id -> session id
	locks     map[string]*lock
	names     *btree.BTreeG[*lock] // the locks ordered by name, for pages; derived from locks
	members   map[string]Member
	policies  map[string]*policy // lock policies by name (budget.go)
	counts    counts             // derived from locks, for the caps
	stats     Stats
	sink      EventSink
	pending   []Event                // events of the entry being applied
	restored  bool                   // the state was replaced: tell the sink at the next entry
	applied   uint64                 // index of the last Raft log entry applied (0: none known)
	publicID  atomic.Pointer[string] // clusterID, for lock-free reads

	clusterVersion uint32       // the cluster version; 0 means 1 (version.go)
	onVersion      func(uint32) // told when clusterVersion changes (OnClusterVersion)
}

// New returns an empty FSM that hands the events of each applied entry to
// sink (see EventSink). sink may be nil: then no events are recorded.
func New(sink EventSink) *FSM {
	f := &FSM{sink: sink}
	f.publicID.Store(new(string))
	f.install(&state{sessions: map[string]*session{}, byRequest: map[string]string{}, locks: map[string]*lock{}, names: newNames(), members: map[string]Member{}, policies: map[string]*policy{}, counts: newCounts()})
	return f
}

// Apply implements raft.FSM.
func (f *FSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyLog(l)
}

// ApplyBatch implements raft.BatchingFSM: one lock for a whole batch.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]any, len(logs))
	for i, l := range logs {
		out[i] = f.applyLog(l)
	}
	return out
}

func (f *FSM) applyLog(l *raft.Log) any {
	f.applied = l.Index
	if l.Type != raft.LogCommand {
		return nil
	}
	return f.applyEntry(l.Data, l.Term, l.Index)
}

// applyEntry applies one command and hands its events to the sink with
// index, the command's log index.
func (f *FSM) applyEntry(data []byte, term, index uint64) *Result {
	r := f.apply(data, term)
	if f.sink != nil {
		f.flushEvents(index)
	}
	return r
}

// ApplyCommand applies one encoded command outside Raft, for tests and
// fuzzing; its events, if any, have index 0. Unknown or malformed commands
// are refused with CodeInvalid and change nothing.
func (f *FSM) ApplyCommand(data []byte) *Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyEntry(data, 0, 0)
}

// apply applies one command; term is its log entry's term (0 outside Raft).
func (f *FSM) apply(data []byte, term uint64) *Result {
	t, m, err := Decode(data)
	if err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	switch t {
	case CmdInit:
		return f.applyInit(m.(*fsmv1.Init))
	case CmdCreateSession:
		return f.applyCreateSession(m.(*fsmv1.CreateSession))
	case CmdCloseSession:
		return f.applyCloseSession(m.(*fsmv1.CloseSession))
	case CmdExpireSession:
		return f.applyExpireSession(m.(*fsmv1.ExpireSession), term)
	case CmdRevokeSession:
		return f.applyRevokeSession(m.(*fsmv1.RevokeSession))
	case CmdAcquire:
		c := m.(*fsmv1.Acquire)
		r := f.authorize(c.SessionId, c.SecretHash, c.Identity)
		if r == nil {
			r = f.applyAcquire(c)
		}
		return f.waitFacts(c, r)
	case CmdRelease:
		c := m.(*fsmv1.Release)
		if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
			return r
		}
		return f.applyRelease(c)
	case CmdCancel:
		c := m.(*fsmv1.Cancel)
		if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
			return r
		}
		return f.applyCancel(c)
	case CmdSetMember:
		return f.applySetMember(m.(*fsmv1.SetMember))
	case CmdComplete:
		c := m.(*fsmv1.Complete)
		if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
			return r
		}
		return f.applyComplete(c)
	case CmdUndelay:
		return f.applyUndelay(m.(*fsmv1.Undelay), term)
	case CmdClearMark:
		return f.applyClearMark(m.(*fsmv1.ClearMark), term)
	case CmdRestore:
		return f.applyRestore(m.(*fsmv1.Restore))
	case CmdSetValue:
		c := m.(*fsmv1.SetValue)
		if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
			return r
		}
		return f.applySetValue(c)
	case CmdSetLockPolicy:
		return f.applySetLockPolicy(m.(*fsmv1.SetLockPolicy))
	case CmdEndHold:
		return f.applyEndHold(m.(*fsmv1.EndHold), term)
	case CmdRequestRelease:
		return f.applyRequestRelease(m.(*fsmv1.RequestRelease))
	case CmdRevokeHold:
		return f.applyRevokeHold(m.(*fsmv1.RevokeHold), term)
	case CmdAcquireMany:
		c := m.(*fsmv1.AcquireMany)
		if r := f.authorize(c.SessionId, c.SecretHash, c.Identity); r != nil {
			return r
		}
		return f.applyAcquireMany(c)
	case CmdSetClusterVersion:
		return f.applySetClusterVersion(m.(*fsmv1.SetClusterVersion))
	}
	return fail(CodeInvalid, "unhandled command type %d", t)
}

func (f *FSM) applyInit(c *fsmv1.Init) *Result {
	if f.clusterID != "" {
		// A second Init (a new leader that raced) changes nothing.
		return &Result{}
	}
	if c.ClusterId == "" {
		return fail(CodeInvalid, "init without cluster id")
	}
	if c.Epoch >= maxEpoch {
		return fail(CodeInvalid, "init epoch %d is not below %d", c.Epoch, uint64(maxEpoch))
	}
	f.clusterID = c.ClusterId
	id := c.ClusterId
	f.publicID.Store(&id)
	f.epoch = c.Epoch
	if f.lastToken < c.Epoch {
		f.lastToken = c.Epoch
	}
	return &Result{}
}
