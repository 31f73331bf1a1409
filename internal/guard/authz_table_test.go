package guard

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestAccessOfEveryRequest pins what each request needs, row by row, as the
// permission check decided it before the method table existed (a switch
// over the request types): the permission, on which name, whether any
// grant of it will do, whether the call is audited as an admin one, and the
// member it concerns. A row of the table that changes any of these fails
// here.
func TestAccessOfEveryRequest(t *testing.T) {
	lock, read, admin := auth.Lock, auth.Read, auth.Admin
	cases := []struct {
		msg  any
		op   string // for a request the table does not know
		want access
	}{
		{&lockdv1.CreateSessionRequest{Owner: "o", RequestId: "r"}, "", access{op: "CreateSession", perm: lock, any: true}},
		{&lockdv1.KeepAliveRequest{SessionId: "s"}, "", access{op: "KeepAlive", perm: lock, any: true}},
		{&lockdv1.KeepAliveBatch{Sessions: []*lockdv1.KeepAliveRequest{{SessionId: "s"}}}, "", access{op: "KeepAlive", perm: lock, any: true}},
		{&lockdv1.CloseSessionRequest{SessionId: "s"}, "", access{op: "CloseSession", perm: lock, any: true}},
		{&lockdv1.AcquireRequest{Name: "a/b"}, "", access{op: "Acquire", perm: lock, name: "a/b"}},
		{&lockdv1.ReleaseRequest{Name: "a/b"}, "", access{op: "Release", perm: lock, name: "a/b"}},
		{&lockdv1.CancelRequest{Name: "a/b"}, "", access{op: "Cancel", perm: lock, name: "a/b"}},
		{&lockdv1.CompleteRequest{Name: "a/b"}, "", access{op: "Complete", perm: lock, name: "a/b"}},
		{&lockdv1.SetValueRequest{Name: "a/b"}, "", access{op: "SetValue", perm: lock, name: "a/b"}},
		{&lockdv1.WatchRequest{Prefix: "a/"}, "", access{op: "Watch", perm: read, name: "a/"}},
		{&lockdv1.CheckTokenRequest{Name: "a/b"}, "", access{op: "CheckToken", perm: read, name: "a/b"}},
		{&lockdv1.DescribeLockRequest{Name: "a/b"}, "", access{op: "DescribeLock", perm: read, name: "a/b"}},
		{&lockdv1.ListLocksRequest{Prefix: "a/"}, "", access{op: "ListLocks", perm: read, name: "a/"}},
		{&lockdv1.ListSessionsRequest{}, "", access{op: "ListSessions", perm: read}},
		{&lockdv1.ClearMarkRequest{Name: "a/b", Token: 3}, "", access{op: "ClearMark", perm: admin, name: "a/b", admin: true}},
		{&lockdv1.ForceReleaseRequest{Name: "a/b"}, "", access{op: "ForceRelease", perm: admin, name: "a/b", admin: true}},
		{&lockdv1.JoinRequest{NodeId: "n2"}, "", access{op: "Join", perm: admin, admin: true, member: "n2"}},
		{&lockdv1.RemoveMemberRequest{NodeId: "n2"}, "", access{op: "RemoveMember", perm: admin, admin: true, member: "n2"}},
		{&lockdv1.TransferLeadershipRequest{NodeId: "n2"}, "", access{op: "TransferLeadership", perm: admin, admin: true, member: "n2"}},
		{SnapshotRequest{}, "SnapshotSave", access{op: "SnapshotSave", perm: admin, admin: true}},
		// Open to any caller with valid credentials.
		{&lockdv1.StatusRequest{}, "Status", access{op: "Status"}},
		// The dashboard's member health (internal/server's
		// memberHealthRequest): a type the table does not know.
		{struct{}{}, "MemberHealth", access{op: "MemberHealth"}},
		{nil, "invalid", access{op: "invalid"}},
	}
	for _, c := range cases {
		if got := accessOf(c.msg, c.op); *got != c.want {
			t.Errorf("%T: access %+v, want %+v", c.msg, *got, c.want)
		}
	}
}
