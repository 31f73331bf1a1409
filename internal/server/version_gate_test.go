//go:build lockdgatetest

package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// These tests need the build tag lockdgatetest: with it, an Acquire of a
// lock named "v2/..." needs command version 2 (internal/fsm,
// version_gatetest.go), a stand-in for a version-2 command. Run them with
//
//	go test -tags lockdgatetest -run TestVersionGate ./internal/server

// TestVersionGateRaisesOnceAllMembersApply: n3 reports version 1 (an
// in-process stand-in for an older binary: WithReportedApplyVersion; the
// real old binary is in cmd/lockd's TestMixedVersionUpgrade). The leader
// refuses a version-2 command before it reaches the log, naming n3; once
// n3 reports version 2 the leader raises the cluster version and the
// command is accepted; every replica holds the same state. A node joining
// with version 1 is then refused, and a cluster version above what a node
// applies stops it.
func TestVersionGateRaisesOnceAllMembersApply(t *testing.T) {
	leakCheck(t)
	opts := defaultClusterOpts()
	opts.nodeOptions = func(id string) []Option {
		if id == "n3" {
			return []Option{WithReportedApplyVersion(1)}
		}
		return nil
	}
	c := newTestCluster(t, 3, opts)
	recordMembers(t, c)
	cl := c.newClient("gate")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := cl.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	old := sess.NewMutex("v1/a")
	if err := old.TryLock(ctx); err != nil {
		t.Fatalf("version-1 acquire: %v", err)
	}

	li, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.server(li)
	before := leader.raft.LastIndex()
	// Refused at once; once the leader has probed n3, the refusal names it.
	v2 := sess.NewMutex("v2/a")
	deadline := time.Now().Add(15 * time.Second)
	for {
		err = v2.TryLock(ctx)
		if !errors.Is(err, lockd.ErrUpgradeRequired) && !errors.Is(err, lockd.ErrUnavailable) {
			t.Fatalf("version-2 acquire at cluster version 1: %v, want ErrUpgradeRequired", err)
		}
		if strings.Contains(fmt.Sprint(err), "needs command version 2 but the cluster is at version 1") && strings.Contains(fmt.Sprint(err), "n3 (version 1)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refusal %v does not name the versions and n3 after 15s", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No Acquire entered the log (the client may follow a failed acquire
	// with a Cancel, which is version 1).
	for i := before + 1; i <= leader.raft.LastIndex(); i++ {
		var l raft.Log
		if err := leader.nd.Hooks().WAL().GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if kind, m, err := fsm.Decode(l.Data); l.Type == raft.LogCommand && err == nil && kind == fsm.CmdAcquire {
			t.Errorf("entry %d after the refusal: %v", i, m)
		}
	}
	if v := leader.fsm.ClusterVersion(); v != 1 {
		t.Fatalf("cluster version %d with n3 at version 1", v)
	}
	st := status(t, c, 2)
	if st.ApplyVersion != 1 || st.ClusterVersion != 1 {
		t.Fatalf("n3 Status: apply %d cluster %d, want 1 and 1", st.ApplyVersion, st.ClusterVersion)
	}

	// "Upgrade" n3: it now reports what it applies.
	c.server(2).nd.Hooks().ReportApplyVersion(0)
	waitClusterVersion(t, c, 2, 30*time.Second)
	if err := v2.TryLock(ctx); err != nil {
		t.Fatalf("version-2 acquire at cluster version 2: %v", err)
	}
	if st := status(t, c, 0); st.ApplyVersion != fsm.ApplyVersion || st.ClusterVersion != 2 {
		t.Fatalf("n1 Status: apply %d cluster %d, want %d and 2", st.ApplyVersion, st.ClusterVersion, fsm.ApplyVersion)
	}
	if err := c.converged(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	// A node of version 1 may not join a cluster at version 2.
	onLeader(t, c, func(s *Server) error {
		cc := lockdv1connect.NewClusterServiceClient(c.nodes[li].hc, s.URL())
		_, err := cc.Join(ctx, connect.NewRequest(&lockdv1.JoinRequest{NodeId: "old", RaftAddress: "old", ApiUrl: "http://127.0.0.1:1"}))
		if connect.CodeOf(err) == connect.CodeUnavailable {
			return err
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || gateReason(err) != lockdv1.ErrorReason_ERROR_REASON_UPGRADE_REQUIRED {
			t.Fatalf("join of a version-1 node: %v, want FAILED_PRECONDITION UPGRADE_REQUIRED", err)
		}
		return nil
	})

	// A cluster version above what the nodes apply (as a downgraded
	// binary would find in its log) stops every node.
	onLeader(t, c, func(s *Server) error {
		_, err := s.nd.Propose(fsm.CmdSetClusterVersion, &fsmv1.SetClusterVersion{Version: fsm.ApplyVersion + 1})
		return err
	})
	deadline = time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		n := len(c.fatals)
		fatals := c.fatals
		if n == 3 {
			c.fatals = nil // expected: not a failure of the cluster
		}
		c.mu.Unlock()
		if n == 3 {
			for _, e := range fatals {
				if !strings.Contains(e.Error(), "run a newer lockd") {
					t.Errorf("fatal: %v", e)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 nodes stopped on a cluster version above theirs: %v", n, fatals)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// status is node i's Status, read directly from it.
func status(t *testing.T, c *tcluster, i int) *lockdv1.StatusResponse {
	t.Helper()
	lc := lockdv1connect.NewLockServiceClient(c.nodes[i].hc, c.nodes[i].url)
	resp, err := lc.Status(context.Background(), connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		t.Fatalf("status of %s: %v", c.nodes[i].id, err)
	}
	return resp.Msg
}

// gateReason is the ErrorDetail reason of a Connect error.
func gateReason(err error) lockdv1.ErrorReason {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if ed, ok := v.(*lockdv1.ErrorDetail); ok {
					return ed.Reason
				}
			}
		}
	}
	return lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED
}
