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
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

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
	Code Code
	Msg  string // for people, set with a non-OK code

	Status    int    // acquire: StatusGranted or StatusQueued
	Token     uint64 // acquire: the grant's token
	Position  uint32 // acquire: 1-based queue position
	Released  bool   // cancel: a raced grant was released
	SessionID string // create session
	Holders   []HolderInfo
	Mark      *Mark // CodeAlreadyDone: the lock's completion mark
	Duplicate bool  // the answer came from the duplicate table
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
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func fail(c Code, format string, args ...any) *Result {
	return &Result{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// Observer is told, synchronously from Apply, about changes the leader's
// lease timers and the blocked Acquire calls need. Implementations must not
// block and must not call back into the FSM.
type Observer interface {
	SessionCreated(id string, ttlMs int64)
	SessionRemoved(id string)
	SessionRevoked(id string)
	// WaitGranted: the queued acquire (session, name, seq) was granted.
	WaitGranted(session, name string, seq, token uint64)
	// WaitDropped: the queued acquire (session, name, seq) left the queue
	// without a grant (cancel, close or expiry).
	WaitDropped(session, name string, seq uint64)
	// MarkSet: lock name got a completion mark (token) kept retentionMs.
	MarkSet(name string, token uint64, retentionMs int64)
	// MarkCleared: lock name's completion mark (token) ended.
	MarkCleared(name string, token uint64)
	// LockDelayed: lock name's holder (token) expired; nothing is granted
	// for delayMs.
	LockDelayed(name string, token uint64, delayMs int64)
	// DelayEnded: lock name's delay started by token ended or was replaced.
	DelayEnded(name string, token uint64)
	// Restored: the whole state was replaced from a snapshot.
	Restored()
}

type session struct {
	id        string
	requestID string
	ttlMs     int64
	owner     string
	created   int64
	revoked   bool
	ack       uint64
	results   map[uint64]*fsmv1.Result
	holds     map[string]*hold // by lock name
	waits     map[string]*wait // by lock name
}

type hold struct {
	session string
	mode    int32
	token   uint64
	seq     uint64
	value   []byte
	granted int64
}

type wait struct {
	session string
	mode    int32
	seq     uint64
	value   []byte
	queued  int64
}

type lock struct {
	name    string
	limit   uint32
	holders []*hold // in token order
	queue   []*wait // FIFO
	mark    *Mark   // completion mark: then no holders or waiters
	delayMs int64   // lock-delay after an expired holder, fixed at creation
	delayed bool    // a lock-delay runs: nothing is granted
	// delayToken is the token of the expired hold that started the delay;
	// Undelay must name it, so an old timer cannot end a newer delay.
	delayToken uint64
}

// Mark is a completion mark: the job a lock guards was done.
type Mark struct {
	Session     string
	Owner       string
	Token       uint64
	CompletedAt int64 // display only
	RetentionMs int64
}

// empty reports whether the lock can be deleted.
func (l *lock) empty() bool {
	return len(l.holders) == 0 && len(l.queue) == 0 && l.mark == nil && !l.delayed
}

// Stats counts what Apply did, for metrics and tests.
type Stats struct {
	Grants      uint64 // all grants
	QueueGrants uint64 // grants to a queued waiter
	Expired     uint64 // sessions expired
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
	members   map[string]Member
	stats     Stats
	obs       Observer
	publicID  atomic.Pointer[string] // clusterID, for lock-free reads
}

// New returns an empty FSM. obs may be nil.
func New(obs Observer) *FSM {
	f := &FSM{obs: obs}
	f.reset()
	return f
}

func (f *FSM) reset() {
	f.clusterID = ""
	f.publicID.Store(new(string))
	f.epoch = 0
	f.lastToken = 0
	f.sessions = map[string]*session{}
	f.byRequest = map[string]string{}
	f.locks = map[string]*lock{}
	f.members = map[string]Member{}
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
	if l.Type != raft.LogCommand {
		return nil
	}
	return f.apply(l.Data, l.Term)
}

// ApplyCommand applies one encoded command outside Raft, for tests and
// fuzzing. Unknown or malformed commands are refused with CodeInvalid and
// change nothing.
func (f *FSM) ApplyCommand(data []byte) *Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.apply(data, 0)
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
		c := m.(*fsmv1.CloseSession)
		if s := f.sessions[c.SessionId]; s != nil {
			f.removeSession(s, 0, false)
		}
		return &Result{}
	case CmdExpireSession:
		c := m.(*fsmv1.ExpireSession)
		if c.Term != 0 && term != 0 && c.Term != term {
			// Decided by an earlier leadership and committed in a later one:
			// leases were restarted in full since, so the decision is stale.
			return fail(CodeInvalid, "stale expiry of session %s decided in term %d, committed in term %d", c.SessionId, c.Term, term)
		}
		if s := f.sessions[c.SessionId]; s != nil {
			f.stats.Expired++
			f.removeSession(s, c.TimeUnixNano, true)
		}
		return &Result{}
	case CmdRevokeSession:
		c := m.(*fsmv1.RevokeSession)
		for _, id := range c.SessionIds {
			if s := f.sessions[id]; s != nil && !s.revoked {
				s.revoked = true
				// A revoked session will never use a lock it waits for;
				// granting one would only keep it from others until expiry.
				f.dropWaits(s, c.TimeUnixNano)
				if f.obs != nil {
					f.obs.SessionRevoked(id)
				}
			}
		}
		return &Result{}
	case CmdAcquire:
		return f.applyAcquire(m.(*fsmv1.Acquire))
	case CmdRelease:
		return f.applyRelease(m.(*fsmv1.Release))
	case CmdCancel:
		return f.applyCancel(m.(*fsmv1.Cancel))
	case CmdSetMember:
		return f.applySetMember(m.(*fsmv1.SetMember))
	case CmdComplete:
		return f.applyComplete(m.(*fsmv1.Complete))
	case CmdUndelay:
		c := m.(*fsmv1.Undelay)
		if c.Term != 0 && term != 0 && c.Term != term {
			return fail(CodeInvalid, "stale end of lock-delay decided in term %d, committed in term %d", c.Term, term)
		}
		if l := f.locks[c.Name]; l != nil && l.delayed && l.delayToken == c.Token {
			l.delayed, l.delayToken = false, 0
			if f.obs != nil {
				f.obs.DelayEnded(c.Name, c.Token)
			}
			f.promote(l, c.TimeUnixNano)
		}
		return &Result{}
	case CmdClearMark:
		c := m.(*fsmv1.ClearMark)
		if c.Term != 0 && term != 0 && c.Term != term {
			return fail(CodeInvalid, "stale mark expiry decided in term %d, committed in term %d", c.Term, term)
		}
		if l := f.locks[c.Name]; l != nil && l.mark != nil && l.mark.Token == c.Token {
			l.mark = nil
			delete(f.locks, l.name) // a marked lock has no holders or waiters
			if f.obs != nil {
				f.obs.MarkCleared(c.Name, c.Token)
			}
		}
		return &Result{}
	case CmdRestore:
		return f.applyRestore(m.(*fsmv1.Restore))
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

func (f *FSM) applyCreateSession(c *fsmv1.CreateSession) *Result {
	if f.clusterID == "" {
		return fail(CodeNotInitialized, "cluster not initialized yet")
	}
	if c.RequestId != "" {
		if id, ok := f.byRequest[c.RequestId]; ok {
			return &Result{SessionID: id, Duplicate: true}
		}
	}
	switch {
	case c.SessionId == "" || len(c.SessionId) > MaxRequestIDBytes:
		return fail(CodeInvalid, "bad session id")
	case len(c.RequestId) > MaxRequestIDBytes:
		return fail(CodeInvalid, "request id longer than %d bytes", MaxRequestIDBytes)
	case len(c.Owner) > MaxOwnerBytes:
		return fail(CodeInvalid, "owner longer than %d bytes", MaxOwnerBytes)
	case c.TtlMs <= 0:
		return fail(CodeInvalid, "ttl must be positive")
	case f.sessions[c.SessionId] != nil:
		return fail(CodeInvalid, "session id %s already exists", c.SessionId)
	case len(f.sessions) >= MaxSessions:
		return fail(CodeTooMany, "too many sessions (%d)", MaxSessions)
	}
	s := &session{
		id: c.SessionId, requestID: c.RequestId, ttlMs: c.TtlMs, owner: c.Owner,
		created: c.TimeUnixNano, ack: 1,
		results: map[uint64]*fsmv1.Result{}, holds: map[string]*hold{}, waits: map[string]*wait{},
	}
	f.sessions[s.id] = s
	if s.requestID != "" {
		f.byRequest[s.requestID] = s.id
	}
	if f.obs != nil {
		f.obs.SessionCreated(s.id, s.ttlMs)
	}
	return &Result{SessionID: s.id}
}

// request runs the duplicate check shared by acquire, release and cancel. It
// returns the session, or a result to answer with at once.
func (f *FSM) request(id string, seq, ack uint64) (*session, *Result) {
	s := f.sessions[id]
	if s == nil {
		return nil, fail(CodeSessionUnknown, "session %s not found (expired or closed)", id)
	}
	if seq == 0 {
		return nil, fail(CodeInvalid, "request seq must be positive")
	}
	if r, ok := s.results[seq]; ok {
		return nil, &Result{Code: Code(r.Code), Msg: dupMsg(Code(r.Code)), Status: statusOf(r), Token: r.Token, Position: r.Position, Released: r.Flag, Duplicate: true}
	}
	if seq < s.ack {
		return nil, fail(CodeInvalid, "request seq %d is below %d: already answered and acknowledged, or too old to tell", seq, s.ack)
	}
	if ack > s.ack && ack <= seq {
		for k := range s.results {
			if k < ack {
				delete(s.results, k)
			}
		}
		s.ack = ack
	}
	return s, nil
}

func statusOf(r *fsmv1.Result) int {
	if r.Code != int32(OK) || r.Token == 0 && r.Position == 0 {
		return 0
	}
	if r.Token != 0 {
		return StatusGranted
	}
	return StatusQueued
}

func dupMsg(c Code) string {
	if c == OK {
		return ""
	}
	return fmt.Sprintf("request refused earlier (code %d)", c)
}

// remember stores a request's answer in the session's duplicate table.
func (f *FSM) remember(s *session, seq uint64, r *Result) *Result {
	if len(s.results) >= maxResults {
		oldest := uint64(0)
		for k := range s.results {
			if oldest == 0 || k < oldest {
				oldest = k
			}
		}
		delete(s.results, oldest)
		// The evicted answer can no longer be replayed, so a retry of that
		// request (or of any older one) must be refused, not applied again.
		if s.ack <= oldest {
			s.ack = oldest + 1
		}
	}
	s.results[seq] = &fsmv1.Result{Seq: seq, Code: int32(r.Code), Token: r.Token, Position: r.Position, Flag: r.Released}
	return r
}

func validMode(m int32) bool { return m == ModeExclusive || m == ModeShared }

func (f *FSM) applyAcquire(c *fsmv1.Acquire) *Result {
	if r := f.liveAcquire(c); r != nil {
		return r
	}
	s, r := f.request(c.SessionId, c.Seq, c.Ack)
	if r != nil {
		if l := f.locks[c.Name]; r.Duplicate && l != nil {
			// The duplicate table keeps codes, not details: name the
			// current holders or mark, as the first answer did.
			switch {
			case r.Code == CodeBusy:
				r.Holders = f.holderInfos(l)
			case r.Code == CodeAlreadyDone && l.mark != nil:
				mark := *l.mark
				r.Mark = &mark
			}
		}
		return r
	}
	if err := ValidateName(c.Name); err != nil {
		return f.remember(s, c.Seq, fail(CodeInvalid, "%v", err))
	}
	if !validMode(c.Mode) {
		return f.remember(s, c.Seq, fail(CodeInvalid, "unknown mode %d", c.Mode))
	}
	if c.LockDelayMs < 0 || c.LockDelayMs > MaxLockDelayMs {
		return f.remember(s, c.Seq, fail(CodeInvalid, "lock-delay %d ms is outside [0, %d]", c.LockDelayMs, MaxLockDelayMs))
	}
	if len(c.Value) > MaxValueBytes {
		return f.remember(s, c.Seq, fail(CodeInvalid, "value is %d bytes, more than %d", len(c.Value), MaxValueBytes))
	}
	if s.revoked {
		return f.remember(s, c.Seq, fail(CodeRevoked, "session %s was force-released", s.id))
	}
	if s.holds[c.Name] != nil {
		return f.remember(s, c.Seq, fail(CodeAlreadyHeld, "session already holds %q", c.Name))
	}
	if s.waits[c.Name] != nil {
		return f.remember(s, c.Seq, fail(CodeAlreadyHeld, "session already waits for %q", c.Name))
	}
	if len(s.holds)+len(s.waits) >= MaxLocksPerSession {
		return f.remember(s, c.Seq, fail(CodeTooMany, "session holds or waits for %d locks already", MaxLocksPerSession))
	}
	l := f.locks[c.Name]
	if l == nil {
		limit := uint32(1)
		if c.Limit != nil {
			limit = *c.Limit
		}
		l = &lock{name: c.Name, limit: limit, delayMs: c.LockDelayMs}
	} else if c.Limit != nil && *c.Limit != l.limit {
		return f.remember(s, c.Seq, fail(CodeLimitMismatch, "lock %q has limit %d, request asked %d", c.Name, l.limit, *c.Limit))
	}
	if l.mark != nil {
		r := fail(CodeAlreadyDone, "the job of lock %q is done (token %d)", c.Name, l.mark.Token)
		mark := *l.mark
		r.Mark = &mark
		return f.remember(s, c.Seq, r)
	}
	if !l.delayed && len(l.queue) == 0 && l.grantable(c.Mode) {
		f.locks[c.Name] = l
		h := f.grant(l, s, c.Mode, c.Seq, c.Value, c.TimeUnixNano)
		return f.remember(s, c.Seq, &Result{Status: StatusGranted, Token: h.token})
	}
	if !c.Wait {
		r := fail(CodeBusy, "lock %q is busy", c.Name)
		r.Holders = f.holderInfos(l)
		switch {
		case l.delayed:
			r.Msg = fmt.Sprintf("lock %q is busy (lock-delay after an expired holder)", c.Name)
		case len(l.holders) == 0:
			r.Msg = fmt.Sprintf("lock %q is busy (waiters queued)", c.Name)
		}
		return f.remember(s, c.Seq, r)
	}
	if len(l.queue) >= MaxWaiters {
		return f.remember(s, c.Seq, fail(CodeTooMany, "lock %q has %d waiters already", c.Name, MaxWaiters))
	}
	f.locks[c.Name] = l
	w := &wait{session: s.id, mode: c.Mode, seq: c.Seq, value: c.Value, queued: c.TimeUnixNano}
	l.queue = append(l.queue, w)
	s.waits[c.Name] = w
	return f.remember(s, c.Seq, &Result{Status: StatusQueued, Position: uint32(len(l.queue))})
}

// liveAcquire answers a repeated acquire whose answer the duplicate table
// has already dropped (a long wait outlives 256 later requests of its
// session) from the state: its wait is still queued, or it was granted.
// Without it, the repeat would be refused while its wait stays live, and a
// grant would later go to a caller that was told it failed.
func (f *FSM) liveAcquire(c *fsmv1.Acquire) *Result {
	s := f.sessions[c.SessionId]
	if s == nil || c.Seq == 0 || c.Seq >= s.ack {
		return nil
	}
	if _, ok := s.results[c.Seq]; ok {
		return nil
	}
	if w := s.waits[c.Name]; w != nil && w.seq == c.Seq {
		return &Result{Status: StatusQueued, Position: uint32(slices.Index(f.locks[c.Name].queue, w) + 1), Duplicate: true}
	}
	if h := s.holds[c.Name]; h != nil && h.seq == c.Seq {
		return &Result{Status: StatusGranted, Token: h.token, Duplicate: true}
	}
	return nil
}

// MaxRetentionMs bounds how long a completion mark is kept (400 days).
const MaxRetentionMs = 400 * 24 * 3600 * 1000

// applyComplete marks the job of a lock done: the session must hold it
// exclusively with the token. The hold is released, every waiter is answered
// "already done", and the mark stays until the leader clears it after the
// retention.
func (f *FSM) applyComplete(c *fsmv1.Complete) *Result {
	s, r := f.request(c.SessionId, c.Seq, c.Ack)
	if r != nil {
		return r
	}
	if c.RetentionMs <= 0 || c.RetentionMs > MaxRetentionMs {
		return f.remember(s, c.Seq, fail(CodeInvalid, "retention %d ms is outside (0, %d]", c.RetentionMs, MaxRetentionMs))
	}
	h := s.holds[c.Name]
	if h == nil || h.token != c.Token {
		return f.remember(s, c.Seq, fail(CodeNotHeld, "lock %q is not held with token %d by this session", c.Name, c.Token))
	}
	if h.mode != ModeExclusive {
		return f.remember(s, c.Seq, fail(CodeInvalid, "only an exclusive hold can complete lock %q", c.Name))
	}
	l := f.locks[c.Name]
	f.removeHold(l, h)
	// Every waiter is answered "already done", in queue order, in one pass
	// (removeWait per waiter would rescan the queue each time).
	for _, w := range l.queue {
		delete(f.sessions[w.session].waits, l.name)
		if f.obs != nil {
			f.obs.WaitDropped(w.session, l.name, w.seq)
		}
	}
	l.queue = nil
	l.mark = &Mark{Session: s.id, Owner: s.owner, Token: h.token, CompletedAt: c.TimeUnixNano, RetentionMs: c.RetentionMs}
	if f.obs != nil {
		f.obs.MarkSet(l.name, h.token, c.RetentionMs)
	}
	return f.remember(s, c.Seq, &Result{})
}

// Delay is a running lock-delay.
type Delay struct {
	Token   uint64 // of the expired hold that started it
	DelayMs int64
}

// WithDelays calls fn with every running lock-delay by lock name while no
// command can be applied (see WithSessions).
func (f *FSM) WithDelays(fn func(map[string]Delay)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := map[string]Delay{}
	for name, l := range f.locks {
		if l.delayed {
			out[name] = Delay{Token: l.delayToken, DelayMs: l.delayMs}
		}
	}
	fn(out)
}

// WithMarks calls fn with every completion mark while no command can be
// applied (see WithSessions).
func (f *FSM) WithMarks(fn func(map[string]Mark)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := map[string]Mark{}
	for name, l := range f.locks {
		if l.mark != nil {
			out[name] = *l.mark
		}
	}
	fn(out)
}

func (l *lock) grantable(mode int32) bool {
	if mode == ModeExclusive {
		return len(l.holders) == 0
	}
	if len(l.holders) > 0 && l.holders[0].mode == ModeExclusive {
		return false
	}
	return l.limit == 0 || uint32(len(l.holders)) < l.limit
}

func (f *FSM) grant(l *lock, s *session, mode int32, seq uint64, value []byte, now int64) *hold {
	f.lastToken++
	f.stats.Grants++
	h := &hold{session: s.id, mode: mode, token: f.lastToken, seq: seq, value: value, granted: now}
	l.holders = append(l.holders, h)
	s.holds[l.name] = h
	return h
}

// promote grants queued waiters from the head while they fit: several shared
// waiters together, an exclusive one alone. A waiting exclusive request stops
// shared ones behind it.
func (f *FSM) promote(l *lock, now int64) {
	for !l.delayed && len(l.queue) > 0 && l.grantable(l.queue[0].mode) {
		w := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		s := f.sessions[w.session]
		delete(s.waits, l.name)
		h := f.grant(l, s, w.mode, w.seq, w.value, now)
		f.stats.QueueGrants++
		if f.obs != nil {
			f.obs.WaitGranted(s.id, l.name, w.seq, h.token)
		}
	}
	if len(l.queue) == 0 {
		l.queue = nil // let the backing array go
	}
	if l.empty() {
		delete(f.locks, l.name)
	}
}

func (f *FSM) removeHold(l *lock, h *hold) {
	l.holders = slices.DeleteFunc(l.holders, func(x *hold) bool { return x == h })
	delete(f.sessions[h.session].holds, l.name)
}

func (f *FSM) removeWait(l *lock, w *wait) {
	l.queue = slices.DeleteFunc(l.queue, func(x *wait) bool { return x == w })
	delete(f.sessions[w.session].waits, l.name)
	if f.obs != nil {
		f.obs.WaitDropped(w.session, l.name, w.seq)
	}
}

func (f *FSM) applyRelease(c *fsmv1.Release) *Result {
	s, r := f.request(c.SessionId, c.Seq, c.Ack)
	if r != nil {
		return r
	}
	h := s.holds[c.Name]
	if h == nil || h.token != c.Token {
		return f.remember(s, c.Seq, fail(CodeNotHeld, "lock %q is not held with token %d by this session", c.Name, c.Token))
	}
	l := f.locks[c.Name]
	f.removeHold(l, h)
	f.promote(l, c.TimeUnixNano)
	return f.remember(s, c.Seq, &Result{})
}

func (f *FSM) applyCancel(c *fsmv1.Cancel) *Result {
	s, r := f.request(c.SessionId, c.Seq, c.Ack)
	if r != nil {
		return r
	}
	l := f.locks[c.Name]
	if w := s.waits[c.Name]; w != nil && w.seq == c.AcquireSeq {
		f.removeWait(l, w)
		f.promote(l, c.TimeUnixNano)
		return f.remember(s, c.Seq, &Result{})
	}
	if h := s.holds[c.Name]; h != nil && h.seq == c.AcquireSeq {
		f.removeHold(l, h)
		f.promote(l, c.TimeUnixNano)
		return f.remember(s, c.Seq, &Result{Released: true})
	}
	if _, answered := s.results[c.AcquireSeq]; !answered && c.AcquireSeq >= s.ack && c.AcquireSeq < c.Seq {
		// The cancel overtook its acquire (still in flight, say through a
		// follower): answer that acquire now, so when it lands it is refused
		// from the duplicate table instead of queuing or taking the lock for
		// a caller that gave up.
		s.results[c.AcquireSeq] = &fsmv1.Result{Seq: c.AcquireSeq, Code: int32(CodeCancelled)}
	}
	return f.remember(s, c.Seq, &Result{})
}

// removeSession releases every hold and drops every wait of s, then grants
// the next waiters of each affected lock, in lock-name order.
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

func (f *FSM) removeSession(s *session, now int64, expired bool) {
	// Sorted, so the Observer hears the same events in the same order on
	// every replica.
	waits := slices.Sorted(maps.Keys(s.waits))
	holds := slices.Sorted(maps.Keys(s.holds))
	for _, name := range waits {
		f.removeWait(f.locks[name], s.waits[name])
	}
	for _, name := range holds {
		l, h := f.locks[name], s.holds[name]
		f.removeHold(l, h)
		if expired && l.delayMs > 0 {
			// The holder did not release: it may still be running. Grant
			// nothing for the lock-delay, counted from this expiry (the
			// leader ends it with Undelay naming this hold's token).
			if l.delayed && f.obs != nil {
				f.obs.DelayEnded(name, l.delayToken) // replaced by this one
			}
			l.delayed, l.delayToken = true, h.token
			if f.obs != nil {
				f.obs.LockDelayed(name, h.token, l.delayMs)
			}
		}
	}
	delete(f.sessions, s.id)
	if s.requestID != "" {
		delete(f.byRequest, s.requestID)
	}
	for _, name := range slices.Compact(slices.Sorted(slices.Values(append(waits, holds...)))) {
		if l := f.locks[name]; l != nil {
			f.promote(l, now)
		}
	}
	if f.obs != nil {
		f.obs.SessionRemoved(s.id)
	}
}

// HolderInfo describes one hold.
type HolderInfo struct {
	Session   string
	Owner     string
	Mode      int32
	Token     uint64
	Seq       uint64
	Value     []byte
	GrantedAt int64
}

// WaiterInfo describes one queued request.
type WaiterInfo struct {
	Session  string
	Owner    string
	Mode     int32
	Seq      uint64
	QueuedAt int64
}

// LockInfo describes a lock.
type LockInfo struct {
	Name    string
	Limit   uint32
	Holders []HolderInfo
	Waiters []WaiterInfo
	Mark    *Mark
	DelayMs int64
	Delayed bool
}

func (f *FSM) holderInfos(l *lock) []HolderInfo {
	out := make([]HolderInfo, len(l.holders))
	for i, h := range l.holders {
		out[i] = HolderInfo{Session: h.session, Owner: f.ownerOf(h.session), Mode: h.mode, Token: h.token, Seq: h.seq, Value: h.value, GrantedAt: h.granted}
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
	li := LockInfo{Name: l.name, Limit: l.limit, Holders: f.holderInfos(l), Waiters: make([]WaiterInfo, len(l.queue)), DelayMs: l.delayMs, Delayed: l.delayed}
	if l.mark != nil {
		m := *l.mark
		li.Mark = &m
	}
	for i, w := range l.queue {
		li.Waiters[i] = WaiterInfo{Session: w.session, Owner: f.ownerOf(w.session), Mode: w.mode, Seq: w.seq, QueuedAt: w.queued}
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
// after, in name order, and whether more remain.
func (f *FSM) List(prefix, after string, n int) ([]LockInfo, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names := make([]string, 0)
	for name := range f.locks {
		if strings.HasPrefix(name, prefix) && name > after {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	more := len(names) > n
	if more {
		names = names[:n]
	}
	out := make([]LockInfo, len(names))
	for i, name := range names {
		out[i] = f.lockInfo(f.locks[name])
	}
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
// (with its token), still queued (with its 1-based position), or neither.
func (f *FSM) WaitState(sessionID, name string, seq uint64) (status int, token uint64, position uint32) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return 0, 0, 0
	}
	if h := s.holds[name]; h != nil && h.seq == seq {
		return StatusGranted, h.token, 0
	}
	if w := s.waits[name]; w != nil && w.seq == seq {
		l := f.locks[name]
		return StatusQueued, 0, uint32(slices.Index(l.queue, w) + 1)
	}
	return 0, 0, 0
}

// SessionInfo describes a session.
type SessionInfo struct {
	ID        string
	Owner     string
	TTLMs     int64
	CreatedAt int64
	Holds     int
	Waits     int
	Revoked   bool
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
	return SessionInfo{ID: s.id, Owner: s.owner, TTLMs: s.ttlMs, CreatedAt: s.created, Holds: len(s.holds), Waits: len(s.waits), Revoked: s.revoked}
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
	ClusterID string
	Epoch     uint64
	LastToken uint64
	Sessions  int
	Locks     int
	Stats     Stats
}

// Info returns a summary of the state.
func (f *FSM) Info() Info {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Info{ClusterID: f.clusterID, Epoch: f.epoch, LastToken: f.lastToken, Sessions: len(f.sessions), Locks: len(f.locks), Stats: f.stats}
}

// ClusterID returns the cluster id, "" before the Init command. It takes no
// lock: every API response carries it.
func (f *FSM) ClusterID() string { return *f.publicID.Load() }

// WithSessions calls fn with every session while no command can be applied,
// so fn sees a state that later observer calls continue exactly (used to
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
