package fsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/codec"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// CmdType is the first byte of every Raft log entry lockd writes. The rest of
// the entry is the protobuf message of that type. Types are never reused.
type CmdType byte

// Command types.
const (
	CmdInit          CmdType = 1
	CmdCreateSession CmdType = 2
	CmdCloseSession  CmdType = 3
	CmdExpireSession CmdType = 4
	CmdRevokeSession CmdType = 5
	CmdAcquire       CmdType = 6
	CmdRelease       CmdType = 7
	CmdCancel        CmdType = 8
	CmdSetMember     CmdType = 9
	CmdRestore       CmdType = 10
	CmdComplete      CmdType = 11
	CmdClearMark     CmdType = 12
	CmdUndelay       CmdType = 13
	CmdSetValue      CmdType = 14
	// CmdSetLockPolicy and CmdEndHold: hold budgets (budget.go). A node
	// of an older version cannot decode them: every node must run a
	// version that has them before they are proposed.
	CmdSetLockPolicy CmdType = 15
	CmdEndHold       CmdType = 16
	// CmdAcquireMany: several locks all at once (many.go); the same rule.
	CmdAcquireMany CmdType = 17
	// CmdRequestRelease: a notice to a lock's holders (revoke.go).
	CmdRequestRelease CmdType = 18
	// CmdRevokeHold: a revoke grace ran out on the leader (revoke.go).
	CmdRevokeHold CmdType = 20
	// CmdSetClusterVersion raises the cluster version (version.go).
	CmdSetClusterVersion CmdType = 19
)

// Limits on request fields, checked by the server before proposing and again
// by Apply (which must survive arbitrary bytes).
const (
	MaxNameBytes      = 512
	MaxValueBytes     = 1024
	MaxOwnerBytes     = 256
	MaxRequestIDBytes = 64
	// MaxSessions, MaxLocksPerSession and MaxWaiters bound the state a
	// client (or a flood of them) can make the cluster keep. They are
	// constants, not configuration: Apply must decide the same on every
	// replica.
	// A session's completion marks count toward MaxLocksPerSession while
	// they live, as its holds and waits do.
	MaxSessions        = 1 << 20
	MaxLocksPerSession = 1 << 14
	MaxWaiters         = 1 << 16
	// MaxMarks bounds the completion marks kept in total: they outlive
	// their sessions, for up to MaxRetentionMs.
	MaxMarks = 1 << 20
	// MaxDelayLocks bounds the locks with a lock-delay (running or to come)
	// in total. It is checked when such a lock is created, since the expiry
	// that starts a delay cannot be refused.
	MaxDelayLocks = 1 << 20
	// MaxPolicies bounds the lock policy table.
	MaxPolicies = 1 << 16
	// maxMembers bounds the member table.
	maxMembers = 1 << 10
	// MaxLockDelayMs bounds a lock-delay (1 h).
	MaxLockDelayMs = 3600 * 1000
	// maxResults bounds the duplicate table of one session even when a
	// client never advances its ack.
	maxResults = 256
	// maxEpoch bounds the epoch an Init may set, and maxLastToken the token
	// counter a snapshot may carry, so the counter can never wrap: a cluster
	// has at least 2^62 grants (146 years at a billion a second) before its
	// snapshots are refused, and 2^63 more before the counter would wrap.
	// Unix microseconds (the epoch) stay below 2^62 for 146,000 years.
	maxEpoch     = 1 << 62
	maxLastToken = 1 << 63
)

// limits are the caps Apply and snapshot checks enforce: the constants
// above, made smaller only by tests (export_test.go) so the property test
// reaches them.
var limits = struct {
	sessions, locksPerSession, waiters, results, marks, delayLocks, members, policies int
}{MaxSessions, MaxLocksPerSession, MaxWaiters, maxResults, MaxMarks, MaxDelayLocks, maxMembers, MaxPolicies}

// Encode returns the log entry for a command: its type byte, then the
// message, encoded by its generated code (protobuf-go refuses what that
// code cannot vouch for, as before).
func Encode(t CmdType, m proto.Message) ([]byte, error) {
	n := 0
	if vm, ok := m.(codec.Message); ok {
		n = vm.SizeVT()
	}
	return codec.Codec{}.MarshalAppend(append(make([]byte, 0, 1+n), byte(t)), m)
}

// Decode parses a log entry written by Encode.
func Decode(b []byte) (CmdType, proto.Message, error) {
	if len(b) == 0 {
		return 0, nil, errors.New("empty command")
	}
	t := CmdType(b[0])
	var m codec.Message
	switch t {
	case CmdInit:
		m = &fsmv1.Init{}
	case CmdCreateSession:
		m = &fsmv1.CreateSession{}
	case CmdCloseSession:
		m = &fsmv1.CloseSession{}
	case CmdExpireSession:
		m = &fsmv1.ExpireSession{}
	case CmdRevokeSession:
		m = &fsmv1.RevokeSession{}
	case CmdAcquire:
		m = &fsmv1.Acquire{}
	case CmdRelease:
		m = &fsmv1.Release{}
	case CmdCancel:
		m = &fsmv1.Cancel{}
	case CmdSetMember:
		m = &fsmv1.SetMember{}
	case CmdRestore:
		m = &fsmv1.Restore{}
	case CmdComplete:
		m = &fsmv1.Complete{}
	case CmdClearMark:
		m = &fsmv1.ClearMark{}
	case CmdUndelay:
		m = &fsmv1.Undelay{}
	case CmdSetValue:
		m = &fsmv1.SetValue{}
	case CmdSetLockPolicy:
		m = &fsmv1.SetLockPolicy{}
	case CmdEndHold:
		m = &fsmv1.EndHold{}
	case CmdAcquireMany:
		m = &fsmv1.AcquireMany{}
	case CmdRequestRelease:
		m = &fsmv1.RequestRelease{}
	case CmdRevokeHold:
		m = &fsmv1.RevokeHold{}
	case CmdSetClusterVersion:
		m = &fsmv1.SetClusterVersion{}
	default:
		return 0, nil, fmt.Errorf("unknown command type %d", b[0])
	}
	// Every node reads an entry as protobuf-go reads it: the same
	// message, or the same error (codec.UnmarshalExact).
	if err := codec.UnmarshalExact(b[1:], m); err != nil {
		return 0, nil, fmt.Errorf("decode command type %d: %w", b[0], err)
	}
	return t, m, nil
}
