package server

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// errorDetail returns the ErrorDetail of a Connect error, or nil.
func errorDetail(err error) *lockdv1.ErrorDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*lockdv1.ErrorDetail); ok {
				return ed
			}
		}
	}
	return nil
}

// TestFollowerAnswersCarryLeaderHint: a follower that cannot serve a
// request (it may not forward it again, or forwarding to the leader fails)
// answers unavailable with the leader's API URL in ErrorDetail.leader_api,
// so a client goes to the leader directly.
func TestFollowerAnswersCarryLeaderHint(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	li, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.server(li)
	fi := (li + 1) % 3
	follower := c.server(fi)
	// The follower learns the leader's API URL from the log (recordSelf).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m, ok := follower.fsm.Member(leader.nodeID); ok && m.API == leader.URL() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("follower never learned the leader's API URL")
		}
	}
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	svc := lockdv1connect.NewLockServiceClient(hc, follower.URL())
	check := func(what string, err error, reason lockdv1.ErrorReason) {
		t.Helper()
		d := errorDetail(err)
		switch {
		case connect.CodeOf(err) != connect.CodeUnavailable || d == nil:
			t.Fatalf("%s: got %v, want unavailable with an ErrorDetail", what, err)
		case d.Reason != reason:
			t.Fatalf("%s: reason %v, want %v (%v)", what, d.Reason, reason, err)
		case d.LeaderApi != leader.URL():
			t.Fatalf("%s: leader_api %q, want the leader's %q (%v)", what, d.LeaderApi, leader.URL(), err)
		}
	}

	// Already forwarded once: the follower may not forward it again.
	req := connect.NewRequest(&lockdv1.CreateSessionRequest{})
	req.Header().Set(ForwardedHeader, "elsewhere")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = svc.CreateSession(ctx, req)
	check("forwarded request", err, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER)

	// Forwarding fails: cut the follower's API link to the leader only,
	// Raft keeps running (the in-memory transports stay connected).
	c.net.change(func() { c.net.group[leader.nodeID] = 1 })
	_, err = svc.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	check("forward refused", err, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN)
	_, err = svc.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: "x"}))
	check("keepalive forward refused", err, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN)
}
