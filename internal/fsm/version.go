package fsm

import (
	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// ApplyVersion is the highest command version this binary applies: every
// command and field of versionTable with a version at most this. Every
// binary before the version gate applies version 1.
//
// Version 2 (hold budgets, sets, deadlock refusal, release requests and
// revoke graces) is not released yet and changed while it was built:
// development builds of it must not be mixed in one cluster; the first
// release that has it fixes it, and any later change gets version 3.
const ApplyVersion = 2

// versionRow says that a command of kind needs version: every such command
// when set is nil, else only those for which set reports true (a field an
// older binary would ignore is set).
type versionRow struct {
	kind    CmdType
	version uint32
	set     func(proto.Message) bool
}

// versionTable gives the version each command and field needs, one row
// each. Every command type has a row without set (TestVersionTableCoversEveryCommand);
// a field that changes what Apply decides gets a row of its own with the
// version that first applies it. Rows are only added, and a version is
// never lowered: an older node would decide the command differently.
var versionTable = []versionRow{
	{CmdInit, 1, nil},
	{CmdCreateSession, 1, nil},
	{CmdCloseSession, 1, nil},
	{CmdExpireSession, 1, nil},
	{CmdRevokeSession, 1, nil},
	{CmdAcquire, 1, nil},
	{CmdRelease, 1, nil},
	{CmdCancel, 1, nil},
	{CmdSetMember, 1, nil},
	{CmdRestore, 1, nil},
	{CmdComplete, 1, nil},
	{CmdClearMark, 1, nil},
	{CmdUndelay, 1, nil},
	{CmdSetValue, 1, nil},
	// Version 1 on purpose: the leader must be able to propose it while the
	// cluster is at 1. An older node fails it (unknown type) on itself
	// only, which is harmless: an older node never gates.
	{CmdSetClusterVersion, 1, nil},
	// Hold budgets, sets, deadlock refusal and release requests
	// (docs/lock-semantics.md).
	{CmdSetLockPolicy, 2, nil},
	{CmdEndHold, 2, nil},
	{CmdAcquireMany, 2, nil},
	{CmdRequestRelease, 2, nil},
	{CmdRevokeHold, 2, nil},
	{CmdCloseSession, 2, func(m proto.Message) bool { return m.(*fsmv1.CloseSession).TimeUnixNano != 0 }},
	{CmdAcquire, 2, func(m proto.Message) bool {
		a := m.(*fsmv1.Acquire)
		return a.MaxHoldMs != 0 || a.MaxHoldCeilingMs != 0 || a.RefuseDeadlock
	}},
}

// NeedsVersion returns the command version a command of kind with message
// m needs: the highest version of its rows. A kind without a row (which
// TestVersionTableCoversEveryCommand rules out for every known type) needs
// more than any binary applies, so the gate refuses it.
func NeedsVersion(kind CmdType, m proto.Message) uint32 {
	var v uint32
	for _, r := range versionTable {
		if r.kind == kind && r.version > v && (r.set == nil || (m != nil && r.set(m))) {
			v = r.version
		}
	}
	if v == 0 {
		return ^uint32(0)
	}
	return v
}

// ClusterVersion returns the cluster version: the highest command version
// the leader may propose, raised by SetClusterVersion (1 before any).
func (f *FSM) ClusterVersion() uint32 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return max(1, f.clusterVersion)
}

// applySetClusterVersion raises the cluster version; a lower or equal one
// changes nothing (a leader that proposed from an older view, or a repeat).
// It does not compare with ApplyVersion: every replica must reach the same
// state, and a node that cannot apply the new version stops by itself (the
// node watches ClusterVersion).
func (f *FSM) applySetClusterVersion(c *fsmv1.SetClusterVersion) *Result {
	if c.Version == 0 {
		return fail(CodeInvalid, "cluster version 0")
	}
	if c.Version > max(1, f.clusterVersion) {
		f.clusterVersion = c.Version
		if f.onVersion != nil {
			f.onVersion(c.Version)
		}
	}
	return &Result{}
}

// OnClusterVersion sets fn to be called, under the FSM's lock (it must not
// block or call back), with the cluster version whenever Apply raises it or
// a snapshot installs one above 1. Set it before Raft starts.
func (f *FSM) OnClusterVersion(fn func(uint32)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onVersion = fn
}
