package server

import (
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// recordMembers records every member's API URL, as a Join does. The
// harness bootstraps its nodes statically (a test-only path: lockd serve
// builds clusters by join), so only a leader has recorded its own, and the
// leader could not ask the others which command version they apply.
func recordMembers(t *testing.T, c *tcluster) {
	t.Helper()
	for _, nd := range c.nodes {
		onLeader(t, c, func(s *Server) error {
			_, err := s.nd.Propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: nd.id, ApiUrl: nd.url, RaftAddress: nd.id})
			return err
		})
	}
}

// upgraded records every member and waits until the cluster version is
// this binary's on every node, so commands of that version (hold budgets,
// sets, deadlock refusal) are accepted.
func upgraded(t *testing.T, c *tcluster) {
	t.Helper()
	recordMembers(t, c)
	waitClusterVersion(t, c, fsm.ApplyVersion, 30*time.Second)
}

// waitClusterVersion polls until every node has applied cluster version v.
func waitClusterVersion(t *testing.T, c *tcluster, v uint32, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		low := ^uint32(0)
		for i := range c.nodes {
			low = min(low, c.server(i).fsm.ClusterVersion())
		}
		if low == v {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster version: lowest %d after %v, want %d", low, timeout, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// onLeader runs f on the leader until it returns nil, for up to 20 s: a
// leadership change on a busy machine is normal.
func onLeader(t *testing.T, c *tcluster, f func(s *Server) error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		li, err := c.waitLeader(10 * time.Second)
		if err == nil {
			if err = f(c.server(li)); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("on the leader: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
