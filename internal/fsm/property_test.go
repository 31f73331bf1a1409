package fsm_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// The model is a deliberately plain lock table: slices, no indexes. The
// property test predicts each command's outcome with it and compares the
// FSM's whole lock table against it after every step.

type mHold struct {
	session    string
	mode       int32
	token, seq uint64
	budget     int64 // max hold ms, 0: none
	asked      bool  // a RequestRelease asked it
	grace      int64 // its revoke grace ms, 0: none
}

type mWait struct {
	session string
	mode    int32
	seq     uint64
	budget  int64
	setSize uint32 // an AcquireMany's lock count, 0: a single acquire
}

type mLock struct {
	limit   uint32
	holders []mHold
	queue   []mWait
	mark    uint64 // completion mark's token, 0 for none
	markBy  string // the session that set the mark
}

type model struct {
	revoked map[string]bool // live sessions: id -> revoked
	locks   map[string]*mLock
	last    uint64
	caps    fsm.Caps
	// policies are the lock policies' default budgets by name, graces
	// their revoke graces (each without zeros).
	policies, graces map[string]int64
}

// budget is the hold budget Apply fixes for acquire a: the request's or
// else the policy's, capped by the ceiling.
func (m *model) budget(a *fsmv1.Acquire) int64 {
	b := a.MaxHoldMs
	if b == 0 {
		b = m.policies[a.Name]
	}
	if c := a.MaxHoldCeilingMs; c > 0 && (b == 0 || c < b) {
		b = c
	}
	return b
}

// setPolicy predicts SetLockPolicy.
func (m *model) setPolicy(p *fsmv1.SetLockPolicy) outcome {
	_, had := m.policies[p.Name]
	_, hadGrace := m.graces[p.Name]
	if !had && !hadGrace && (p.DefaultMaxHoldMs != 0 || p.RevokeGraceMs != 0) && m.policyCount() >= m.caps.Policies {
		return outcome{code: fsm.CodeTooMany}
	}
	delete(m.policies, p.Name)
	delete(m.graces, p.Name)
	if p.DefaultMaxHoldMs != 0 {
		m.policies[p.Name] = p.DefaultMaxHoldMs
	}
	if p.RevokeGraceMs != 0 {
		m.graces[p.Name] = p.RevokeGraceMs
	}
	return outcome{}
}

// policyCount counts the names with a policy.
func (m *model) policyCount() int {
	n := len(m.policies)
	for name := range m.graces {
		if _, ok := m.policies[name]; !ok {
			n++
		}
	}
	return n
}

// requestRelease predicts RequestRelease: every holder is asked, and an
// admin's request on a lock with a revoke grace sets it on holds without.
func (m *model) requestRelease(r *fsmv1.RequestRelease) {
	l := m.locks[r.Name]
	if l == nil {
		return
	}
	for i := range l.holders {
		h := &l.holders[i]
		h.asked = true
		if g := m.graces[r.Name]; r.Admin && h.grace == 0 {
			h.grace = g
		}
	}
}

// revokeHold predicts RevokeHold: the session of the named hold (session
// and token) is revoked, when that hold is there.
func (m *model) revokeHold(r *fsmv1.RevokeHold) {
	l := m.locks[r.Name]
	if l == nil || !slices.ContainsFunc(l.holders, func(h mHold) bool { return h.token == r.Token && h.session == r.SessionId }) {
		return
	}
	if revoked, ok := m.revoked[r.SessionId]; ok && !revoked {
		m.revoked[r.SessionId] = true
		m.dropWaits(r.SessionId)
	}
}

// endHold predicts EndHold: the named hold (session and token) ends as on
// expiry (the model's locks have no lock-delay) and the queue moves.
func (m *model) endHold(e *fsmv1.EndHold) {
	l := m.locks[e.Name]
	if l == nil {
		return
	}
	n := len(l.holders)
	l.holders = slices.DeleteFunc(l.holders, func(h mHold) bool { return h.token == e.Token && h.session == e.SessionId })
	if len(l.holders) != n {
		m.settle(e.Name)
	}
}

// used counts what session id has toward the per-session cap: holds,
// waits and live completion marks.
func (m *model) used(id string) int {
	n := 0
	for _, l := range m.locks {
		if l.has(id) {
			n++
		}
		if l.mark != 0 && l.markBy == id {
			n++
		}
	}
	return n
}

// marks counts the live completion marks.
func (m *model) marks() int {
	n := 0
	for _, l := range m.locks {
		if l.mark != 0 {
			n++
		}
	}
	return n
}

// outcome is the part of a Result the model predicts.
type outcome struct {
	code     fsm.Code
	status   int
	token    uint64
	position uint32
	released bool
}

func (l *mLock) fits(mode int32) bool {
	if mode == excl {
		return len(l.holders) == 0
	}
	if len(l.holders) > 0 && l.holders[0].mode == excl {
		return false
	}
	return l.limit == 0 || uint32(len(l.holders)) < l.limit
}

func (l *mLock) has(session string) bool {
	return slices.ContainsFunc(l.holders, func(h mHold) bool { return h.session == session }) ||
		slices.ContainsFunc(l.queue, func(w mWait) bool { return w.session == session })
}

func (m *model) grant(l *mLock, session string, mode int32, seq uint64, budget int64) uint64 {
	m.last++
	l.holders = append(l.holders, mHold{session: session, mode: mode, token: m.last, seq: seq, budget: budget})
	return m.last
}

// settle grants queued requests from the head while they fit, and forgets
// a lock nobody holds or waits for. A set request at the head is granted
// only when it heads every one of its queues and fits every lock; then the
// queues of its other locks are settled next, in the order reached.
func (m *model) settle(name string) {
	work := []string{name}
	for len(work) > 0 {
		n := work[0]
		work = work[1:]
		l := m.locks[n]
		if l == nil {
			continue
		}
		for len(l.queue) > 0 {
			w := l.queue[0]
			if w.setSize > 0 {
				names := m.groupNames(w.session, w.seq)
				if !m.groupFits(names, w.session, w.seq) {
					break
				}
				for _, gn := range names {
					gl := m.locks[gn]
					gw := gl.queue[0]
					gl.queue = gl.queue[1:]
					m.grant(gl, gw.session, gw.mode, gw.seq, gw.budget)
					if gn != n {
						work = append(work, gn)
					}
				}
				continue
			}
			if !l.fits(w.mode) {
				break
			}
			l.queue = l.queue[1:]
			m.grant(l, w.session, w.mode, w.seq, w.budget)
		}
		if len(l.holders) == 0 && len(l.queue) == 0 && l.mark == 0 {
			delete(m.locks, n)
		}
	}
}

// groupNames returns, by name, the locks whose queues hold a wait of the
// set request (session, seq).
func (m *model) groupNames(session string, seq uint64) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(m.locks)) {
		if slices.ContainsFunc(m.locks[name].queue, func(w mWait) bool { return w.session == session && w.seq == seq && w.setSize > 0 }) {
			out = append(out, name)
		}
	}
	return out
}

// groupFits reports whether the set request heads each of names' queues
// and fits each lock.
func (m *model) groupFits(names []string, session string, seq uint64) bool {
	for _, n := range names {
		l := m.locks[n]
		if l == nil || len(l.queue) == 0 || l.queue[0].session != session || l.queue[0].seq != seq || !l.fits(l.queue[0].mode) {
			return false
		}
	}
	return true
}

// dropGroup removes the set request's waits from names' queues.
func (m *model) dropGroup(names []string, session string, seq uint64) {
	for _, n := range names {
		l := m.locks[n]
		l.queue = slices.DeleteFunc(l.queue, func(w mWait) bool { return w.session == session && w.seq == seq })
	}
}

// acquireMany predicts AcquireMany: all at once, one queued request, or a
// refusal that changes nothing.
func (m *model) acquireMany(a *fsmv1.AcquireMany) outcome {
	revoked, ok := m.revoked[a.SessionId]
	switch {
	case !ok:
		return outcome{code: fsm.CodeSessionUnknown}
	case fsm.ValidateAcquireMany(a) != nil:
		return outcome{code: fsm.CodeInvalid}
	case revoked:
		return outcome{code: fsm.CodeRevoked}
	case m.used(a.SessionId)+len(a.Locks) > m.caps.LocksPerSession:
		return outcome{code: fsm.CodeTooMany}
	}
	ls := slices.Clone(a.Locks)
	slices.SortFunc(ls, func(x, y *fsmv1.ManyLock) int { return strings.Compare(x.Name, y.Name) })
	locks := make([]*mLock, len(ls))
	free := true
	for i, ml := range ls {
		l := m.locks[ml.Name]
		if l != nil && l.has(a.SessionId) {
			return outcome{code: fsm.CodeAlreadyHeld}
		}
		if l == nil {
			l = &mLock{limit: 1}
			if ml.Limit != nil {
				l.limit = *ml.Limit
			}
		} else if ml.Limit != nil && *ml.Limit != l.limit {
			return outcome{code: fsm.CodeLimitMismatch}
		}
		if l.mark != 0 {
			return outcome{code: fsm.CodeAlreadyDone}
		}
		if len(l.queue) > 0 || !l.fits(ml.Mode) {
			free = false
		}
		locks[i] = l
	}
	budget := a.MaxHoldMs
	if budget == 0 {
		for _, ml := range ls {
			if p := m.policies[ml.Name]; p != 0 && (budget == 0 || p < budget) {
				budget = p
			}
		}
	}
	if c := a.MaxHoldCeilingMs; c > 0 && (budget == 0 || c < budget) {
		budget = c
	}
	if free {
		var first uint64
		for i, l := range locks {
			m.locks[ls[i].Name] = l
			tok := m.grant(l, a.SessionId, ls[i].Mode, a.Seq, budget)
			if i == 0 {
				first = tok
			}
		}
		return outcome{status: fsm.StatusGranted, token: first}
	}
	if !a.Wait {
		return outcome{code: fsm.CodeBusy}
	}
	var blockers []string
	for _, l := range locks {
		if len(l.queue) >= m.caps.Waiters {
			return outcome{code: fsm.CodeTooMany}
		}
		blockers = append(blockers, mBlockers(l, a.SessionId, len(l.queue))...)
	}
	if m.reaches(blockers, a.SessionId) {
		return outcome{code: fsm.CodeDeadlock}
	}
	for i, l := range locks {
		m.locks[ls[i].Name] = l
		l.queue = append(l.queue, mWait{a.SessionId, ls[i].Mode, a.Seq, budget, uint32(len(ls))})
	}
	return outcome{status: fsm.StatusQueued, position: uint32(len(locks[0].queue))}
}

func (m *model) acquire(a *fsmv1.Acquire) outcome {
	revoked, ok := m.revoked[a.SessionId]
	switch {
	case !ok:
		return outcome{code: fsm.CodeSessionUnknown}
	case revoked:
		return outcome{code: fsm.CodeRevoked}
	}
	l := m.locks[a.Name]
	if l != nil && l.has(a.SessionId) {
		return outcome{code: fsm.CodeAlreadyHeld}
	}
	if m.used(a.SessionId) >= m.caps.LocksPerSession {
		return outcome{code: fsm.CodeTooMany}
	}
	if l == nil {
		l = &mLock{limit: 1}
		if a.Limit != nil {
			l.limit = *a.Limit
		}
	} else if a.Limit != nil && *a.Limit != l.limit {
		return outcome{code: fsm.CodeLimitMismatch}
	}
	if l.mark != 0 {
		return outcome{code: fsm.CodeAlreadyDone}
	}
	if len(l.queue) == 0 && l.fits(a.Mode) {
		m.locks[a.Name] = l
		return outcome{status: fsm.StatusGranted, token: m.grant(l, a.SessionId, a.Mode, a.Seq, m.budget(a))}
	}
	if !a.Wait {
		return outcome{code: fsm.CodeBusy}
	}
	if len(l.queue) >= m.caps.Waiters {
		return outcome{code: fsm.CodeTooMany}
	}
	if a.RefuseDeadlock && m.reaches(mBlockers(l, a.SessionId, len(l.queue)), a.SessionId) {
		return outcome{code: fsm.CodeDeadlock}
	}
	m.locks[a.Name] = l
	l.queue = append(l.queue, mWait{a.SessionId, a.Mode, a.Seq, m.budget(a), 0})
	return outcome{status: fsm.StatusQueued, position: uint32(len(l.queue))}
}

func (m *model) release(r *fsmv1.Release) outcome {
	if _, ok := m.revoked[r.SessionId]; !ok {
		return outcome{code: fsm.CodeSessionUnknown}
	}
	l := m.locks[r.Name]
	if l == nil {
		return outcome{code: fsm.CodeNotHeld}
	}
	i := slices.IndexFunc(l.holders, func(h mHold) bool { return h.session == r.SessionId && h.token == r.Token })
	if i < 0 {
		return outcome{code: fsm.CodeNotHeld}
	}
	l.holders = slices.Delete(l.holders, i, i+1)
	m.settle(r.Name)
	return outcome{}
}

// complete marks a held exclusive lock done: the hold goes, every waiter is
// dropped, the mark stays.
func (m *model) complete(c *fsmv1.Complete) outcome {
	if _, ok := m.revoked[c.SessionId]; !ok {
		return outcome{code: fsm.CodeSessionUnknown}
	}
	if c.RetentionMs <= 0 || c.RetentionMs > fsm.MaxRetentionMs {
		return outcome{code: fsm.CodeInvalid}
	}
	l := m.locks[c.Name]
	if l == nil {
		return outcome{code: fsm.CodeNotHeld}
	}
	i := slices.IndexFunc(l.holders, func(h mHold) bool { return h.session == c.SessionId && h.token == c.Token })
	if i < 0 {
		return outcome{code: fsm.CodeNotHeld}
	}
	if l.holders[i].mode != excl {
		return outcome{code: fsm.CodeInvalid}
	}
	if m.marks() >= m.caps.Marks {
		return outcome{code: fsm.CodeTooMany}
	}
	queue := l.queue
	l.holders, l.queue, l.mark, l.markBy = nil, nil, c.Token, c.SessionId
	var others []string
	for _, w := range queue {
		if w.setSize > 0 {
			names := m.groupNames(w.session, w.seq)
			m.dropGroup(names, w.session, w.seq)
			others = append(others, names...)
		}
	}
	slices.Sort(others)
	for _, n := range slices.Compact(others) {
		m.settle(n)
	}
	return outcome{}
}

// clearMark ends a mark with the given token.
func (m *model) clearMark(c *fsmv1.ClearMark) {
	if l := m.locks[c.Name]; l != nil && l.mark != 0 && l.mark == c.Token {
		delete(m.locks, c.Name)
	}
}

func (m *model) cancel(c *fsmv1.Cancel) outcome {
	if _, ok := m.revoked[c.SessionId]; !ok {
		return outcome{code: fsm.CodeSessionUnknown}
	}
	l := m.locks[c.Name]
	if l == nil {
		return outcome{}
	}
	if i := slices.IndexFunc(l.queue, func(w mWait) bool { return w.session == c.SessionId && w.seq == c.AcquireSeq }); i >= 0 && l.queue[i].setSize > 0 {
		names := m.groupNames(c.SessionId, c.AcquireSeq)
		m.dropGroup(names, c.SessionId, c.AcquireSeq)
		for _, n := range names {
			m.settle(n)
		}
		return outcome{}
	}
	if i := slices.IndexFunc(l.queue, func(w mWait) bool { return w.session == c.SessionId && w.seq == c.AcquireSeq }); i >= 0 {
		l.queue = slices.Delete(l.queue, i, i+1)
		m.settle(c.Name)
		return outcome{}
	}
	if i := slices.IndexFunc(l.holders, func(h mHold) bool { return h.session == c.SessionId && h.seq == c.AcquireSeq }); i >= 0 {
		l.holders = slices.Delete(l.holders, i, i+1)
		m.settle(c.Name)
		return outcome{released: true}
	}
	return outcome{}
}

// dropWaits drops a revoked session's waits, then grants what became free.
func (m *model) dropWaits(id string) {
	var affected []string
	for name, l := range m.locks {
		if slices.ContainsFunc(l.queue, func(w mWait) bool { return w.session == id }) {
			affected = append(affected, name)
		}
		l.queue = slices.DeleteFunc(l.queue, func(w mWait) bool { return w.session == id })
	}
	slices.Sort(affected)
	for _, name := range affected {
		m.settle(name)
	}
}

// remove drops a session's waits and holds everywhere, then grants what
// became free, lock by lock in name order.
func (m *model) remove(id string) {
	if _, ok := m.revoked[id]; !ok {
		return
	}
	delete(m.revoked, id)
	var affected []string
	for name, l := range m.locks {
		if l.has(id) {
			affected = append(affected, name)
		}
		l.queue = slices.DeleteFunc(l.queue, func(w mWait) bool { return w.session == id })
		l.holders = slices.DeleteFunc(l.holders, func(h mHold) bool { return h.session == id })
	}
	slices.Sort(affected)
	for _, name := range affected {
		m.settle(name)
	}
}

// compare reports how the FSM's lock table differs from the model's.
func (m *model) compare(snap *fsmv1.Snapshot) error {
	if snap.LastToken != m.last {
		return fmt.Errorf("last token: got %d, want %d", snap.LastToken, m.last)
	}
	var ids []string
	for _, s := range snap.Sessions {
		ids = append(ids, s.Id)
		if s.Revoked != m.revoked[s.Id] {
			return fmt.Errorf("session %s revoked: got %v, want %v", s.Id, s.Revoked, m.revoked[s.Id])
		}
	}
	if want := slices.Sorted(maps.Keys(m.revoked)); !slices.Equal(ids, want) {
		return fmt.Errorf("sessions: got %v, want %v", ids, want)
	}
	var names []string
	for _, pl := range snap.Locks {
		names = append(names, pl.Name)
		l := m.locks[pl.Name]
		if l == nil {
			continue
		}
		var holders []mHold
		for _, h := range pl.Holders {
			holders = append(holders, mHold{h.SessionId, h.Mode, h.Token, h.Seq, h.MaxHoldMs, h.Asked, h.RevokeGraceMs})
		}
		var queue []mWait
		for _, w := range pl.Queue {
			queue = append(queue, mWait{w.SessionId, w.Mode, w.Seq, w.MaxHoldMs, w.SetSize})
		}
		if mark := pl.GetMark().GetToken(); mark != l.mark {
			return fmt.Errorf("lock %q: completion mark %d, want %d", pl.Name, mark, l.mark)
		}
		if pl.Limit != l.limit || !slices.Equal(holders, l.holders) || !slices.Equal(queue, l.queue) {
			return fmt.Errorf("lock %q:\n got limit %d holders %v queue %v\nwant limit %d holders %v queue %v", pl.Name, pl.Limit, holders, queue, l.limit, l.holders, l.queue)
		}
	}
	if want := slices.Sorted(maps.Keys(m.locks)); !slices.Equal(names, want) {
		return fmt.Errorf("locks: got %v, want %v", names, want)
	}
	got, graces := map[string]int64{}, map[string]int64{}
	for _, p := range snap.Policies {
		if p.DefaultMaxHoldMs != 0 {
			got[p.Name] = p.DefaultMaxHoldMs
		}
		if p.RevokeGraceMs != 0 {
			graces[p.Name] = p.RevokeGraceMs
		}
	}
	if !maps.Equal(got, m.policies) || !maps.Equal(graces, m.graces) {
		return fmt.Errorf("lock policies: got %v and graces %v, want %v and %v", got, graces, m.policies, m.graces)
	}
	return nil
}

// client is a test session's view: its next seq, and the tokens it held.
type client struct {
	id      string
	next    uint64
	granted map[string][]uint64 // lock name -> tokens ever granted
}

type applied struct {
	data   []byte
	msg    proto.Message
	result *fsm.Result
}

// machine drives one FSM ("main") and checks it after each command against
// the model, a twin FSM fed the same commands, and a shadow FSM restored
// from a snapshot taken just before the command.
type machine struct {
	main, twin     *fsm.FSM
	mainRec        *recorder
	twinRec        *recorder
	model          *model
	clients        []*client
	history        []applied
	maxToken       uint64
	now            int64
	queueGrantsObs int
	// noCycles: every acquire refuses deadlocks, and no cycle of waiting
	// sessions may survive any command.
	noCycles bool
}

func newMachine(t *rapid.T) *machine {
	m := &machine{mainRec: &recorder{}, twinRec: &recorder{}, model: &model{revoked: map[string]bool{}, locks: map[string]*mLock{}, last: epoch, caps: fsm.CurrentCaps(), policies: map[string]int64{}, graces: map[string]int64{}}}
	m.main, m.twin = fsm.New(m.mainRec), fsm.New(m.twinRec)
	m.exec(t, &fsmv1.Init{ClusterId: "c1", Epoch: epoch}, outcome{}, false)
	m.maxToken = epoch
	return m
}

func resultString(r *fsm.Result) string {
	c := *r
	mark := ""
	if c.Mark != nil {
		mark = fmt.Sprintf("%+v", *c.Mark)
		c.Mark = nil
	}
	return fmt.Sprintf("%+v mark=%s", c, mark)
}

// exec applies msg to every FSM and checks everything. want is the model's
// prediction; replay marks a re-applied earlier command, which must change
// nothing at all.
func (m *machine) exec(t *rapid.T, msg proto.Message, want outcome, replay bool) *fsm.Result {
	t.Helper()
	return m.execData(t, msg, cmd(t, msg), want, replay)
}

func (m *machine) execData(t *rapid.T, msg proto.Message, data []byte, want outcome, replay bool) *fsm.Result {
	t.Helper()
	m.now++
	pre := m.main.State()
	shadow := fsm.New(nil)
	b := persist(t, m.main)
	checkEncoding(t, m.main, b)
	if err := shadow.RestoreBytes(b); err != nil {
		t.Fatalf("restore of a snapshot: %v", err)
	}
	if got := shadow.State(); !proto.Equal(got, pre) {
		t.Fatalf("restored state differs:\n got %v\nwant %v", got, pre)
	}

	r := m.main.ApplyCommand(data)
	events := m.mainRec.take()
	if rt := m.twin.ApplyCommand(data); resultString(rt) != resultString(r) {
		t.Fatalf("twin result %s, main %s", resultString(rt), resultString(r))
	}
	if te := m.twinRec.take(); !slices.Equal(te, events) {
		t.Fatalf("twin events %q, main %q", te, events)
	}
	if rs := shadow.ApplyCommand(data); resultString(rs) != resultString(r) {
		t.Fatalf("restored FSM result %s, original %s", resultString(rs), resultString(r))
	}
	post := m.main.State()
	if got := m.twin.State(); !proto.Equal(got, post) {
		t.Fatalf("twin state differs:\n got %v\nwant %v", got, post)
	}
	if got := shadow.State(); !proto.Equal(got, post) {
		t.Fatalf("restored FSM state differs after the same command:\n got %v\nwant %v", got, post)
	}
	if err := checkInvariants(post); err != nil {
		t.Fatalf("after %T %v: %v", msg, msg, err)
	}
	if err := checkCaps(post, m.model.caps); err != nil {
		t.Fatalf("after %T %v: %v", msg, msg, err)
	}
	for _, f := range []*fsm.FSM{m.main, m.twin, shadow} {
		if err := f.CheckCounts(); err != nil {
			t.Fatalf("after %T %v: %v", msg, msg, err)
		}
		if err := f.CheckNames(); err != nil {
			t.Fatalf("after %T %v: %v", msg, msg, err)
		}
		if err := checkTimerViews(f, post); err != nil {
			t.Fatalf("after %T %v: %v", msg, msg, err)
		}
	}
	m.checkGrants(t, pre, post, events)
	if replay {
		if !proto.Equal(pre, post) {
			t.Fatalf("re-applied %T %v changed the state:\n got %v\nwant %v", msg, msg, post, pre)
		}
	} else {
		got := outcome{r.Code, r.Status, r.Token, r.Position, r.Released}
		if got != want {
			t.Fatalf("%T %v: got %+v (%s), model says %+v", msg, msg, got, r.Msg, want)
		}
		if r.Code != fsm.OK && r.Msg == "" {
			t.Fatalf("%T %v: refused without a message", msg, msg)
		}
		m.history = append(m.history, applied{data, msg, r})
	}
	if err := m.model.compare(post); err != nil {
		t.Fatalf("after %T %v: %v", msg, msg, err)
	}
	if m.noCycles && m.model.cycles() {
		t.Fatalf("after %T %v: sessions wait for each other in a cycle", msg, msg)
	}
	return r
}

type waitKey struct {
	session, name string
	seq           uint64
}

// checkGrants checks the step's new grants against the one before: tokens
// fresh and increasing in grant order, exactly one grant event per grant,
// one dequeued event per waiter that left without a grant, and queue order
// respected.
func (m *machine) checkGrants(t *rapid.T, pre, post *fsmv1.Snapshot, events []string) {
	t.Helper()
	old := map[uint64]bool{}
	queued := map[waitKey]int{} // pre-step queue position
	preQueue := map[string][]waitKey{}
	for _, l := range pre.Locks {
		for _, h := range l.Holders {
			old[h.Token] = true
		}
		for i, w := range l.Queue {
			k := waitKey{w.SessionId, l.Name, w.Seq}
			queued[k] = i
			preQueue[l.Name] = append(preQueue[l.Name], k)
		}
	}
	stillQueued := map[waitKey]bool{}
	var fresh []uint64
	var wantEvents []string
	granted := map[waitKey]bool{}
	for _, l := range post.Locks {
		for _, w := range l.Queue {
			stillQueued[waitKey{w.SessionId, l.Name, w.Seq}] = true
		}
		for _, h := range l.Holders {
			if old[h.Token] {
				continue
			}
			fresh = append(fresh, h.Token)
			k := waitKey{h.SessionId, l.Name, h.Seq}
			wantEvents = append(wantEvents, fmt.Sprintf("granted %s %q %d %d", k.session, k.name, k.seq, h.Token))
			if _, ok := queued[k]; ok {
				granted[k] = true
			}
		}
	}
	slices.Sort(fresh)
	for _, tok := range fresh {
		if tok <= m.maxToken {
			t.Fatalf("new grant with token %d, not above every earlier token (max %d)", tok, m.maxToken)
		}
		m.maxToken = tok
	}
	if got := post.LastToken - pre.LastToken; pre.ClusterId != "" && got != uint64(len(fresh)) {
		t.Fatalf("token counter moved by %d for %d new grants", got, len(fresh))
	}
	// FIFO: a waiter is granted only if every waiter ahead of it on that
	// lock left the queue in this step.
	for k := range granted {
		for _, ahead := range preQueue[k.name][:queued[k]] {
			if stillQueued[ahead] {
				t.Fatalf("waiter %v granted while %v, queued before it, still waits", k, ahead)
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(queued), func(a, b waitKey) int {
		return cmpWait(a, b)
	}) {
		if !stillQueued[k] && !granted[k] {
			wantEvents = append(wantEvents, fmt.Sprintf("dropped %s %q %d", k.session, k.name, k.seq))
		}
	}
	var gotEvents []string
	for _, e := range events {
		if e[0] == 'g' || e[0] == 'd' {
			gotEvents = append(gotEvents, e)
		}
	}
	// Grant events come in token order; compare both as sets, plus order
	// of grants.
	var gotGrants []string
	for _, e := range gotEvents {
		if e[0] == 'g' {
			gotGrants = append(gotGrants, e)
		}
	}
	m.queueGrantsObs += len(granted) // the grants events name are checked below
	slices.Sort(gotEvents)
	slices.Sort(wantEvents)
	if !slices.Equal(gotEvents, wantEvents) {
		t.Fatalf("events: got %q, want %q", gotEvents, wantEvents)
	}
	if !slices.IsSortedFunc(gotGrants, func(a, b string) int { return cmpU(tokenOf(a), tokenOf(b)) }) {
		t.Fatalf("grant events not in token order: %q", gotGrants)
	}
	if got := m.main.Info().Stats.QueueGrants; got != uint64(m.queueGrantsObs) {
		t.Fatalf("QueueGrants stat %d, observer saw %d", got, m.queueGrantsObs)
	}
}

func cmpWait(a, b waitKey) int {
	if a.name != b.name {
		return cmpS(a.name, b.name)
	}
	if a.session != b.session {
		return cmpS(a.session, b.session)
	}
	return cmpU(a.seq, b.seq)
}

func cmpS(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func tokenOf(event string) uint64 {
	var s, n string
	var seq, tok uint64
	fmt.Sscanf(event, "granted %s %q %d %d", &s, &n, &seq, &tok)
	return tok
}

var lockNames = []string{"a", "b", "c"}

// pickClient mostly picks a live, unrevoked session, sometimes any.
func (m *machine) pickClient(t *rapid.T) *client {
	var usable []*client
	for _, c := range m.clients {
		if revoked, live := m.model.revoked[c.id]; live && !revoked {
			usable = append(usable, c)
		}
	}
	if len(usable) == 0 || rapid.IntRange(0, 4).Draw(t, "anySession") == 0 {
		return rapid.SampledFrom(m.clients).Draw(t, "session")
	}
	return rapid.SampledFrom(usable).Draw(t, "session")
}

func (m *machine) nextSeq(t *rapid.T, c *client) (seq, ack uint64) {
	c.next++
	seq = c.next
	// Mostly no ack, so the duplicate table fills and retries hit it.
	switch rapid.IntRange(0, 5).Draw(t, "ack") {
	case 0:
		ack = seq
	case 1:
		ack = rapid.Uint64Range(0, seq).Draw(t, "ackAt")
	}
	return seq, ack
}

func (m *machine) createSession(t *rapid.T) {
	id := fmt.Sprintf("s%d", len(m.clients))
	m.model.revoked[id] = false
	m.exec(t, newSession(id), outcome{}, false)
	m.clients = append(m.clients, &client{id: id, granted: map[string][]uint64{}})
}

func (m *machine) acquire(t *rapid.T) {
	c := m.pickClient(t)
	seq, ack := m.nextSeq(t, c)
	a := &fsmv1.Acquire{
		SessionId:    c.id,
		Seq:          seq,
		Ack:          ack,
		Name:         rapid.SampledFrom(lockNames).Draw(t, "name"),
		Mode:         rapid.SampledFrom([]int32{excl, shrd}).Draw(t, "mode"),
		Wait:         rapid.Bool().Draw(t, "wait"),
		Value:        []byte(c.id),
		TimeUnixNano: m.now,
	}
	if l := rapid.IntRange(-6, 3).Draw(t, "limit"); l >= 0 {
		a.Limit = proto.Uint32(uint32(l))
	}
	a.MaxHoldMs = rapid.SampledFrom([]int64{0, 0, 1000, 5000}).Draw(t, "maxHold")
	a.RefuseDeadlock = rapid.IntRange(0, 3).Draw(t, "refuseDeadlock") > 0
	if m.noCycles {
		a.RefuseDeadlock = true
	}
	a.MaxHoldCeilingMs = rapid.SampledFrom([]int64{0, 0, 2000}).Draw(t, "maxHoldCeiling")
	r := m.exec(t, a, m.model.acquire(a), false)
	if r.Token != 0 {
		c.granted[a.Name] = append(c.granted[a.Name], r.Token)
	}
}

func (m *machine) release(t *rapid.T) {
	c := m.pickClient(t)
	var held []mHold // what the model says c holds now
	for _, name := range lockNames {
		if l := m.model.locks[name]; l != nil {
			for _, h := range l.holders {
				if h.session == c.id {
					held = append(held, h)
				}
			}
		}
	}
	if len(held) > 0 && rapid.IntRange(0, 2).Draw(t, "releaseHeld") > 0 {
		i := rapid.IntRange(0, len(held)-1).Draw(t, "held")
		seq, ack := m.nextSeq(t, c)
		name := ""
		for n, l := range m.model.locks {
			if slices.Contains(l.holders, held[i]) {
				name = n
			}
		}
		r := &fsmv1.Release{SessionId: c.id, Seq: seq, Ack: ack, Name: name, Token: held[i].token, TimeUnixNano: m.now}
		if got := m.exec(t, r, m.model.release(r), false); got.Code != fsm.OK {
			t.Fatalf("release of a held lock: got %s", resultString(got))
		}
		return
	}
	name := rapid.SampledFrom(lockNames).Draw(t, "name")
	tokens := []uint64{epoch + 1, rapid.Uint64().Draw(t, "anyToken")}
	tokens = append(tokens, c.granted[name]...) // the current one and stale ones
	if l := m.model.locks[name]; l != nil {
		for _, h := range l.holders {
			tokens = append(tokens, h.token) // other holders' tokens
		}
	}
	token := rapid.SampledFrom(tokens).Draw(t, "token")
	seq, ack := m.nextSeq(t, c)
	r := &fsmv1.Release{SessionId: c.id, Seq: seq, Ack: ack, Name: name, Token: token, TimeUnixNano: m.now}
	m.exec(t, r, m.model.release(r), false)
}

func (m *machine) cancel(t *rapid.T) {
	c := m.pickClient(t)
	name := rapid.SampledFrom(lockNames).Draw(t, "name")
	seq, ack := m.nextSeq(t, c)
	x := &fsmv1.Cancel{SessionId: c.id, Seq: seq, Ack: ack, Name: name, AcquireSeq: rapid.Uint64Range(1, seq).Draw(t, "acquireSeq"), TimeUnixNano: m.now}
	m.exec(t, x, m.model.cancel(x), false)
}

// complete completes one of the client's holds (or a wrong token/lock),
// with a valid or an invalid retention.
func (m *machine) complete(t *rapid.T) {
	c := m.pickClient(t)
	name := rapid.SampledFrom(lockNames).Draw(t, "name")
	tokens := []uint64{epoch + 1, rapid.Uint64().Draw(t, "anyToken")}
	if l := m.model.locks[name]; l != nil {
		for _, h := range l.holders {
			tokens = append(tokens, h.token)
		}
	}
	token := rapid.SampledFrom(tokens).Draw(t, "token")
	retention := rapid.SampledFrom([]int64{60000, 0, -1}).Draw(t, "retention")
	// Mostly a job the client does hold, so marks pile up to their cap.
	var own []string
	for _, n := range lockNames {
		if l := m.model.locks[n]; l != nil && len(l.holders) == 1 && l.holders[0].session == c.id && l.holders[0].mode == excl {
			own = append(own, n)
		}
	}
	if len(own) > 0 && rapid.IntRange(0, 2).Draw(t, "ownJob") > 0 {
		name = rapid.SampledFrom(own).Draw(t, "ownName")
		token, retention = m.model.locks[name].holders[0].token, 60000
	}
	seq, ack := m.nextSeq(t, c)
	x := &fsmv1.Complete{SessionId: c.id, Seq: seq, Ack: ack, Name: name, Token: token, RetentionMs: retention, TimeUnixNano: m.now}
	m.exec(t, x, m.model.complete(x), false)
}

// clearMark ends a mark (the right token or another one), as the leader's
// retention timer would.
func (m *machine) clearMark(t *rapid.T) {
	name := rapid.SampledFrom(lockNames).Draw(t, "name")
	tokens := []uint64{rapid.Uint64().Draw(t, "anyToken")}
	if l := m.model.locks[name]; l != nil && l.mark != 0 {
		tokens = append(tokens, l.mark, l.mark)
	}
	x := &fsmv1.ClearMark{Name: name, Token: rapid.SampledFrom(tokens).Draw(t, "token")}
	m.model.clearMark(x)
	m.exec(t, x, outcome{}, false)
}

// acquireMany takes two or three locks at once, or queues one request on
// each.
func (m *machine) acquireMany(t *rapid.T) {
	c := m.pickClient(t)
	seq, ack := m.nextSeq(t, c)
	names := slices.Clone(lockNames)
	n := rapid.IntRange(2, 3).Draw(t, "manyN")
	a := &fsmv1.AcquireMany{SessionId: c.id, Seq: seq, Ack: ack, Wait: rapid.Bool().Draw(t, "wait"), Value: []byte(c.id), TimeUnixNano: m.now,
		MaxHoldMs: rapid.SampledFrom([]int64{0, 0, 1000}).Draw(t, "maxHold")}
	for range n {
		i := rapid.IntRange(0, len(names)-1).Draw(t, "manyName")
		ml := &fsmv1.ManyLock{Name: names[i], Mode: rapid.SampledFrom([]int32{excl, shrd}).Draw(t, "mode")}
		names = slices.Delete(names, i, i+1)
		if l := rapid.IntRange(-4, 3).Draw(t, "limit"); l >= 0 {
			ml.Limit = proto.Uint32(uint32(l))
		}
		a.Locks = append(a.Locks, ml)
	}
	r := m.exec(t, a, m.model.acquireMany(a), false)
	if r.Status == fsm.StatusGranted {
		ls := slices.Clone(a.Locks)
		slices.SortFunc(ls, func(x, y *fsmv1.ManyLock) int { return strings.Compare(x.Name, y.Name) })
		if len(r.Tokens) != len(ls) {
			t.Fatalf("granted set of %d locks with tokens %v", len(ls), r.Tokens)
		}
		for i, ml := range ls {
			c.granted[ml.Name] = append(c.granted[ml.Name], r.Tokens[i])
		}
	}
}

// requestRelease asks a lock's holders to let go, as a waiter or an admin.
func (m *machine) requestRelease(t *rapid.T) {
	r := &fsmv1.RequestRelease{Name: rapid.SampledFrom(lockNames).Draw(t, "name"), Reason: "r", Admin: rapid.Bool().Draw(t, "admin")}
	m.model.requestRelease(r)
	m.exec(t, r, outcome{}, false)
}

// revokeHold revokes a hold's session as the leader's grace timer does:
// mostly a live hold, sometimes one that does not match (a late timer),
// which must change nothing.
func (m *machine) revokeHold(t *rapid.T) {
	r := &fsmv1.RevokeHold{Name: rapid.SampledFrom(lockNames).Draw(t, "name"), SessionId: m.pickClient(t).id, Token: rapid.Uint64Range(epoch, m.model.last).Draw(t, "token"), TimeUnixNano: m.now}
	if l := m.model.locks[r.Name]; l != nil && len(l.holders) > 0 && rapid.IntRange(0, 3).Draw(t, "liveHold") > 0 {
		h := rapid.SampledFrom(l.holders).Draw(t, "hold")
		r.SessionId, r.Token = h.session, h.token
	}
	m.model.revokeHold(r)
	m.exec(t, r, outcome{}, false)
}

// setPolicy sets or removes a lock's default hold budget.
func (m *machine) setPolicy(t *rapid.T) {
	p := &fsmv1.SetLockPolicy{Name: rapid.SampledFrom(lockNames).Draw(t, "name"), DefaultMaxHoldMs: rapid.SampledFrom([]int64{0, 3000, 7000}).Draw(t, "defaultMaxHold"), RevokeGraceMs: rapid.SampledFrom([]int64{0, 0, 2000}).Draw(t, "revokeGrace")}
	m.exec(t, p, m.model.setPolicy(p), false)
}

// endHold ends a hold as the leader's budget timer does: mostly a live
// hold, sometimes one whose token or session does not match (a late
// timer), which must change nothing. Tokens are drawn from those issued:
// a timer never names a grant yet to come, and a replay of one that did
// would end that grant.
func (m *machine) endHold(t *rapid.T) {
	e := &fsmv1.EndHold{Name: rapid.SampledFrom(lockNames).Draw(t, "name"), SessionId: m.pickClient(t).id, Token: rapid.Uint64Range(epoch, m.model.last).Draw(t, "token"), TimeUnixNano: m.now}
	if l := m.model.locks[e.Name]; l != nil && len(l.holders) > 0 && rapid.IntRange(0, 3).Draw(t, "liveHold") > 0 {
		h := rapid.SampledFrom(l.holders).Draw(t, "hold")
		e.SessionId, e.Token = h.session, h.token
	}
	m.model.endHold(e)
	m.exec(t, e, outcome{}, false)
}

func (m *machine) closeOrExpire(t *rapid.T) {
	c := m.pickClient(t)
	var msg proto.Message = &fsmv1.CloseSession{SessionId: c.id, Seq: c.next + 1}
	if rapid.Bool().Draw(t, "expire") {
		msg = &fsmv1.ExpireSession{SessionId: c.id, TimeUnixNano: m.now}
	}
	m.model.remove(c.id)
	m.exec(t, msg, outcome{}, false)
}

func (m *machine) revoke(t *rapid.T) {
	ids := []string{m.pickClient(t).id, m.pickClient(t).id}
	for _, id := range ids {
		if revoked, ok := m.model.revoked[id]; ok && !revoked {
			m.model.revoked[id] = true
			m.model.dropWaits(id)
		}
	}
	m.exec(t, &fsmv1.RevokeSession{SessionIds: ids}, outcome{}, false)
}

// replay re-applies an earlier command's bytes, as a retried or duplicated
// log entry would: it must answer as the first time (or refuse) and change
// nothing. A delayed retry of a release must not free a newer grant.
func (m *machine) replay(t *rapid.T) {
	var candidates []int
	for i, a := range m.history {
		// A create replayed after the session ended would start a new
		// (empty) session: allowed by design, so not replayed here.
		if cs, ok := a.msg.(*fsmv1.CreateSession); ok {
			if _, live := m.model.revoked[cs.SessionId]; !live {
				continue
			}
		}
		// A policy set again sets what it set (an admin's repeat): not a
		// duplicate the FSM detects, so not replayed here.
		if _, ok := a.msg.(*fsmv1.SetLockPolicy); ok {
			continue
		}
		// A release request asks whoever holds the lock now: replayed
		// after a new grant, it asks that hold too, by design.
		if _, ok := a.msg.(*fsmv1.RequestRelease); ok {
			continue
		}
		candidates = append(candidates, i)
	}
	a := m.history[rapid.SampledFrom(candidates).Draw(t, "replay")]
	pre := m.main.State()
	r := m.execData(t, a.msg, a.data, outcome{}, true)

	session, seq, isRequest := requestOf(a.data)
	if !isRequest {
		if cs, ok := a.msg.(*fsmv1.CreateSession); ok && (!r.Duplicate || r.SessionID != cs.SessionId) {
			t.Fatalf("replayed create: got %s, want a duplicate of %s", resultString(r), cs.SessionId)
		}
		return
	}
	var ps *fsmv1.Session
	for _, s := range pre.Sessions {
		if s.Id == session {
			ps = s
		}
	}
	var first *fsmv1.Result
	if ps != nil {
		for _, res := range ps.Results {
			if res.Seq == seq {
				first = res
			}
		}
	}
	switch {
	case ps == nil:
		if r.Code != fsm.CodeSessionUnknown {
			t.Fatalf("replay for a gone session: got %s, want CodeSessionUnknown", resultString(r))
		}
	case first != nil:
		f := a.result
		if !r.Duplicate || r.Code != f.Code || r.Token != f.Token || r.Status != f.Status || r.Position != f.Position || r.Released != f.Released {
			t.Fatalf("replay: got %s, want the first answer %s", resultString(r), resultString(f))
		}
	case liveAcquire(pre, a.msg, session, seq) != nil:
		// An acquire whose answer was dropped but whose wait or hold is
		// still live is answered from the state.
		live := liveAcquire(pre, a.msg, session, seq)
		if r.Code != fsm.OK || !r.Duplicate || r.Status != live.status || r.Token != live.token || r.Position != live.position {
			t.Fatalf("replay of live acquire seq %d: got %s, want status %d token %d position %d", seq, resultString(r), live.status, live.token, live.position)
		}
	default:
		// Acknowledged (or evicted): refused.
		if r.Code != fsm.CodeInvalid || seq >= ps.Ack {
			t.Fatalf("replay of seq %d (session ack %d) without a remembered answer: got %s, want CodeInvalid", seq, ps.Ack, resultString(r))
		}
	}
}

// reuse sends another request under the seq of an earlier one (a client's
// counter bug, a restarted script): another lock, or another mode for an
// acquire. It must be refused (CodeInvalid, or CodeSessionUnknown once the
// session is gone) and change nothing, whether the first answer is still
// remembered, was acknowledged or was evicted.
func (m *machine) reuse(t *rapid.T) {
	var candidates []int
	for i, a := range m.history {
		if _, _, ok := requestOf(a.data); ok {
			candidates = append(candidates, i)
		}
	}
	if len(candidates) == 0 {
		return
	}
	a := m.history[rapid.SampledFrom(candidates).Draw(t, "reuse")]
	msg := proto.CloneOf(a.msg)
	other := func(name string) string {
		return rapid.SampledFrom(slices.DeleteFunc(slices.Clone(lockNames), func(n string) bool { return n == name })).Draw(t, "otherName")
	}
	switch x := msg.(type) {
	case *fsmv1.Acquire:
		if rapid.Bool().Draw(t, "otherMode") {
			x.Mode = excl + shrd - x.Mode
		} else {
			x.Name = other(x.Name)
		}
	case *fsmv1.Release:
		x.Name = other(x.Name)
	case *fsmv1.Cancel:
		x.Name = other(x.Name)
	case *fsmv1.Complete:
		x.Name = other(x.Name)
	case *fsmv1.AcquireMany:
		x.Locks[0].Mode = excl + shrd - x.Locks[0].Mode
	}
	session, seq, _ := requestOf(a.data)
	_, live := m.model.revoked[session]
	r := m.exec(t, msg, outcome{}, true)
	switch {
	case live && r.Code != fsm.CodeInvalid:
		t.Fatalf("%T %v reusing seq %d of %v: got %s, want CodeInvalid", msg, msg, seq, a.msg, resultString(r))
	case !live && r.Code != fsm.CodeSessionUnknown:
		t.Fatalf("%T %v for a gone session: got %s, want CodeSessionUnknown", msg, msg, resultString(r))
	}
}

type liveAnswer struct {
	status   int
	token    uint64
	position uint32
}

// liveAcquire finds the live wait or hold made by the acquire (session,
// seq) in the state pre, if msg is such an acquire.
func liveAcquire(pre *fsmv1.Snapshot, msg proto.Message, session string, seq uint64) *liveAnswer {
	if many, ok := msg.(*fsmv1.AcquireMany); ok {
		return liveMany(pre, many, session, seq)
	}
	acq, ok := msg.(*fsmv1.Acquire)
	if !ok {
		return nil
	}
	for _, l := range pre.Locks {
		if l.Name != acq.Name {
			continue
		}
		for _, h := range l.Holders {
			if h.SessionId == session && h.Seq == seq {
				return &liveAnswer{status: fsm.StatusGranted, token: h.Token}
			}
		}
		for i, w := range l.Queue {
			if w.SessionId == session && w.Seq == seq {
				return &liveAnswer{status: fsm.StatusQueued, position: uint32(i + 1)}
			}
		}
	}
	return nil
}

// restoreMain replaces the main FSM by one restored from its snapshot, so
// later steps run on restored structures.
func (m *machine) restoreMain(t *rapid.T) {
	f := fsm.New(m.mainRec)
	if err := f.RestoreBytes(persist(t, m.main)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := m.mainRec.take(); !slices.Equal(got, []string{"restored"}) {
		t.Fatalf("events on restore: got %q", got)
	}
	m.main = f
	m.queueGrantsObs = 0 // stats are not part of the state
}

// propertyCaps are small enough that a run of 100 steps reaches every cap
// the model predicts (and checkCaps checks).
var propertyCaps = fsm.Caps{Sessions: fsm.MaxSessions, LocksPerSession: 2, Waiters: 2, Results: 4, Marks: 1, DelayLocks: 1, Members: 16, Policies: 2}

func TestProperties(t *testing.T) {
	fsm.SetCaps(t, propertyCaps)
	fsm.SetNamesDegree(t, 2)
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		m.createSession(t)
		m.createSession(t)
		actions := []struct {
			name   string
			weight int
			run    func(*rapid.T)
		}{
			{"create", 2, m.createSession},
			{"acquire", 6, m.acquire},
			{"release", 4, m.release},
			{"cancel", 2, m.cancel},
			{"complete", 1, m.complete},
			{"clearMark", 1, m.clearMark},
			{"close", 1, m.closeOrExpire},
			{"revoke", 1, m.revoke},
			{"replay", 3, m.replay},
			{"reuse", 2, m.reuse},
			{"restore", 1, m.restoreMain},
			{"list", 1, m.list},
			{"setPolicy", 1, m.setPolicy},
			{"acquireMany", 4, m.acquireMany},
			{"requestRelease", 1, m.requestRelease},
			{"endHold", 2, m.endHold},
			{"revokeHold", 1, m.revokeHold},
		}
		var deck []int
		for i, a := range actions {
			for range a.weight {
				deck = append(deck, i)
			}
		}
		steps := rapid.IntRange(1, 100).Draw(t, "steps")
		for range steps {
			a := actions[rapid.SampledFrom(deck).Draw(t, "action")]
			a.run(t)
		}
	})
}

// checkTimerViews reports whether the marks and running lock-delays a new
// leader starts its timers from (WithMarks, WithDelays) are exactly those
// of the state snap.
func checkTimerViews(f *fsm.FSM, snap *fsmv1.Snapshot) error {
	var marks map[string]fsm.Mark
	var delays map[string]fsm.Delay
	f.WithMarks(func(m map[string]fsm.Mark) { marks = m })
	f.WithDelays(func(d map[string]fsm.Delay) { delays = d })
	nm, nd := 0, 0
	for _, l := range snap.Locks {
		if l.Mark != nil {
			nm++
			if m, ok := marks[l.Name]; !ok || m.Token != l.Mark.Token {
				return fmt.Errorf("lock %q: mark %v, WithMarks gives %+v", l.Name, l.Mark, marks[l.Name])
			}
		}
		if l.Delayed {
			nd++
			if d, ok := delays[l.Name]; !ok || d.Token != l.DelayToken {
				return fmt.Errorf("lock %q: delayed with token %d, WithDelays gives %+v", l.Name, l.DelayToken, delays[l.Name])
			}
		}
	}
	if len(marks) != nm || len(delays) != nd {
		return fmt.Errorf("WithMarks gives %d marks, WithDelays %d delays; the state has %d and %d", len(marks), len(delays), nm, nd)
	}
	return nil
}

// checkCaps reports a table of snap beyond its cap: sessions, each
// session's duplicate table (and its floor), holds, waits and marks per
// session, waiters per lock, marks and lock-delay locks in total, members.
func checkCaps(snap *fsmv1.Snapshot, caps fsm.Caps) error {
	if len(snap.Policies) > caps.Policies {
		return fmt.Errorf("%d lock policies, cap %d", len(snap.Policies), caps.Policies)
	}
	if len(snap.Sessions) > caps.Sessions {
		return fmt.Errorf("%d sessions, cap %d", len(snap.Sessions), caps.Sessions)
	}
	used := map[string]int{}
	marks, delayLocks := 0, 0
	for _, l := range snap.Locks {
		if len(l.Queue) > caps.Waiters {
			return fmt.Errorf("lock %q: %d waiters, cap %d", l.Name, len(l.Queue), caps.Waiters)
		}
		for _, h := range l.Holders {
			used[h.SessionId]++
		}
		for _, w := range l.Queue {
			used[w.SessionId]++
		}
		if l.Mark != nil {
			marks++
			used[l.Mark.SessionId]++
		}
		if l.LockDelayMs > 0 {
			delayLocks++
		}
	}
	for _, s := range snap.Sessions {
		if len(s.Results) > caps.Results {
			return fmt.Errorf("session %s: %d remembered answers, cap %d", s.Id, len(s.Results), caps.Results)
		}
		for i, r := range s.Results {
			if r.Seq < s.Ack || i > 0 && r.Seq <= s.Results[i-1].Seq {
				return fmt.Errorf("session %s: answer for seq %d (floor %d) out of place", s.Id, r.Seq, s.Ack)
			}
		}
		if used[s.Id] > caps.LocksPerSession {
			return fmt.Errorf("session %s: %d holds, waits and marks, cap %d", s.Id, used[s.Id], caps.LocksPerSession)
		}
	}
	switch {
	case marks > caps.Marks:
		return fmt.Errorf("%d completion marks, cap %d", marks, caps.Marks)
	case delayLocks > caps.DelayLocks:
		return fmt.Errorf("%d locks with a lock-delay, cap %d", delayLocks, caps.DelayLocks)
	case len(snap.Members) > caps.Members:
		return fmt.Errorf("%d members, cap %d", len(snap.Members), caps.Members)
	}
	return nil
}

// list checks a random page of List against the model's lock names.
func (m *machine) list(t *rapid.T) {
	prefix := rapid.SampledFrom([]string{"", "a", "b", "c", "d", "ab"}).Draw(t, "listPrefix")
	after := rapid.SampledFrom([]string{"", "a", "b", "c", "d", "A"}).Draw(t, "listAfter")
	n := rapid.IntRange(0, 4).Draw(t, "listN")
	checkPage(t, m.main, slices.Sorted(maps.Keys(m.model.locks)), prefix, after, n)
}

// checkPage checks f.List(prefix, after, n) against a filter of names (all
// the lock names, sorted): the names with the prefix after after, the
// first n of them, and whether more remain.
func checkPage(t fataler, f *fsm.FSM, names []string, prefix, after string, n int) {
	t.Helper()
	var want []string
	for _, name := range names {
		if strings.HasPrefix(name, prefix) && name > after {
			want = append(want, name)
		}
	}
	wantMore := len(want) > n
	if wantMore {
		want = want[:n]
	}
	page, more := f.List(prefix, after, n)
	var got []string
	for _, l := range page {
		got = append(got, l.Name)
	}
	if !slices.Equal(got, want) || more != wantMore {
		t.Fatalf("List(%q, %q, %d) of %v: got %v more %v, want %v more %v", prefix, after, n, names, got, more, want, wantMore)
	}
}

// indexNames are lock names with shared prefixes, enough of them that a
// name index of degree 2 splits and merges nodes.
var indexNames = []string{"a", "a/1", "a/2", "a/2/x", "a/3", "ab", "ab/1", "b", "b/1", "b/2", "b/3", "b/4", "c", "c/a", "c/b", "c/c", "c/d", "d", "d/1", "e"}

// TestPropertyNameIndex: after any sequence of the commands that create
// and delete locks (acquire, release, cancel, complete, clear a mark,
// close, expire, restore from a snapshot), the name index holds exactly
// the lock table's names, and List pages agree with a filter of the
// table's names, with an index of tiny nodes.
func TestPropertyNameIndex(t *testing.T) {
	fsm.SetNamesDegree(t, 2)
	rapid.Check(t, func(t *rapid.T) {
		f := initFSM(t, nil)
		var sessions []string
		seq := map[string]uint64{}
		newSess := func() {
			id := fmt.Sprintf("s%d", len(sessions))
			mustOK(t, f, newSession(id))
			sessions = append(sessions, id)
		}
		newSess()
		newSess()
		next := func(s string) uint64 { seq[s]++; return seq[s] }
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for range steps {
			s := rapid.SampledFrom(sessions).Draw(t, "session")
			name := rapid.SampledFrom(indexNames).Draw(t, "name")
			var m proto.Message
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1, 2, 3:
				n := next(s)
				m = &fsmv1.Acquire{SessionId: s, Seq: n, Ack: n, Name: name, Mode: rapid.SampledFrom([]int32{excl, shrd}).Draw(t, "mode"), Wait: rapid.Bool().Draw(t, "wait")}
			case 4, 5:
				if l, ok := f.Describe(name); ok && len(l.Holders) > 0 {
					h := rapid.SampledFrom(l.Holders).Draw(t, "holder")
					n := next(h.Session)
					m = &fsmv1.Release{SessionId: h.Session, Seq: n, Ack: n, Name: name, Token: h.Token}
				}
			case 6:
				if l, ok := f.Describe(name); ok && len(l.Waiters) > 0 {
					w := rapid.SampledFrom(l.Waiters).Draw(t, "waiter")
					n := next(w.Session)
					m = &fsmv1.Cancel{SessionId: w.Session, Seq: n, Ack: n, Name: name, AcquireSeq: w.Seq}
				}
			case 7:
				if l, ok := f.Describe(name); ok && len(l.Holders) == 1 && l.Holders[0].Mode == excl {
					h := l.Holders[0]
					n := next(h.Session)
					m = &fsmv1.Complete{SessionId: h.Session, Seq: n, Ack: n, Name: name, Token: h.Token, RetentionMs: 60000}
				} else if ok && l.Mark != nil {
					m = &fsmv1.ClearMark{Name: name, Token: l.Mark.Token}
				}
			case 8:
				if rapid.Bool().Draw(t, "expire") {
					m = &fsmv1.ExpireSession{SessionId: s}
				} else {
					m = &fsmv1.CloseSession{SessionId: s, Seq: next(s)}
				}
				sessions = slices.DeleteFunc(sessions, func(x string) bool { return x == s })
				newSess()
			case 9:
				g := fsm.New(nil)
				if err := g.RestoreBytes(persist(t, f)); err != nil {
					t.Fatalf("restore: %v", err)
				}
				f = g
			}
			if m != nil {
				f.ApplyCommand(cmd(t, m))
			}
			if err := f.CheckNames(); err != nil {
				t.Fatalf("after %T %v: %v", m, m, err)
			}
			names := f.LockNames()
			prefix := rapid.SampledFrom([]string{"", "a", "a/", "a/2", "ab", "b/", "c/", "d", "z"}).Draw(t, "prefix")
			after := rapid.SampledFrom(append([]string{"", "0", "a/0", "b/25", "zz"}, indexNames...)).Draw(t, "after")
			checkPage(t, f, names, prefix, after, rapid.IntRange(0, 5).Draw(t, "n"))
		}
	})
}

// liveMany finds the live holds (all of them) or queued set request made
// by the AcquireMany (session, seq) in the state pre.
func liveMany(pre *fsmv1.Snapshot, a *fsmv1.AcquireMany, session string, seq uint64) *liveAnswer {
	if fsm.ValidateAcquireMany(a) != nil {
		return nil
	}
	names := map[string]int32{}
	first := ""
	for _, ml := range a.Locks {
		names[ml.Name] = ml.Mode
		if first == "" || ml.Name < first {
			first = ml.Name
		}
	}
	var firstToken uint64
	held := 0
	for _, l := range pre.Locks {
		mode, ok := names[l.Name]
		if !ok {
			continue
		}
		for _, h := range l.Holders {
			if h.SessionId == session && h.Seq == seq && h.Mode == mode {
				held++
				if l.Name == first {
					firstToken = h.Token
				}
			}
		}
	}
	if held == len(names) {
		return &liveAnswer{status: fsm.StatusGranted, token: firstToken}
	}
	for _, l := range pre.Locks {
		if l.Name != first {
			continue
		}
		for i, w := range l.Queue {
			if w.SessionId == session && w.Seq == seq && w.SetSize > 0 {
				return &liveAnswer{status: fsm.StatusQueued, position: uint32(i + 1)}
			}
		}
	}
	return nil
}

// mBlockers returns the sessions a request of session on l, queued at pos,
// waits for: l's holders and every earlier request (internal/fsm,
// deadlock.go, says why every one counts).
func mBlockers(l *mLock, session string, pos int) []string {
	var out []string
	for _, h := range l.holders {
		if h.session != session {
			out = append(out, h.session)
		}
	}
	for _, q := range l.queue[:min(pos, len(l.queue))] {
		if q.session != session {
			out = append(out, q.session)
		}
	}
	return out
}

// heldBack returns the sessions a request w of session on l, queued at
// pos, cannot be granted before: l's holders, and the earlier requests that
// keep it behind them (FIFO: all but a single shared request before a
// single shared w). A cycle of these is a real deadlock.
func heldBack(l *mLock, session string, w mWait, pos int) []string {
	out := mBlockers(l, session, 0)
	for _, q := range l.queue[:pos] {
		if q.session != session && (q.setSize > 0 || w.setSize > 0 || q.mode == excl || w.mode == excl) {
			out = append(out, q.session)
		}
	}
	return out
}

// reaches reports whether some session of from waits, directly or through
// others, for target.
func (m *model) reaches(from []string, target string) bool {
	return m.reachesBy(from, target, func(l *mLock, s string, _ mWait, i int) []string { return mBlockers(l, s, i) })
}

// reachesBy is reaches over the edges next gives.
func (m *model) reachesBy(from []string, target string, next func(l *mLock, s string, w mWait, pos int) []string) bool {
	seen := map[string]bool{}
	stack := slices.Clone(from)
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if s == target {
			return true
		}
		if seen[s] {
			continue
		}
		seen[s] = true
		for _, l := range m.locks {
			for i, w := range l.queue {
				if w.session == s {
					stack = append(stack, next(l, s, w, i)...)
				}
			}
		}
	}
	return false
}

// cycles reports whether any waiting session is held back, through others,
// by itself: a real deadlock (heldBack's edges, fewer than the ones the
// refusals count).
func (m *model) cycles() bool {
	for _, l := range m.locks {
		for i, w := range l.queue {
			if m.reachesBy(heldBack(l, w.session, w, i), w.session, heldBack) {
				return true
			}
		}
	}
	return false
}

// TestPropertyNoDeadlockCycle runs the random commands with acquires that
// all refuse deadlocks (as a server of this version sends them), single and
// sets, exclusive and shared, mutexes and semaphores: after every command,
// grants included, no waiting session waits, through others, for itself.
// Each refused acquire is predicted by the model's own walk of the
// waits-for graph.
func TestPropertyNoDeadlockCycle(t *testing.T) {
	fsm.SetCaps(t, propertyCaps)
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		m.noCycles = true
		for range 4 {
			m.createSession(t)
		}
		actions := []func(*rapid.T){m.acquire, m.acquire, m.acquire, m.acquireMany, m.acquireMany, m.release, m.release, m.cancel, m.closeOrExpire, m.endHold}
		for range rapid.IntRange(1, 80).Draw(t, "steps") {
			rapid.SampledFrom(actions).Draw(t, "action")(t)
		}
	})
}
