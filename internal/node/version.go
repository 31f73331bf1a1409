package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// This file is the version gate: the leader learns which command version
// every member applies, raises the replicated cluster version when all of
// them apply a higher one, and Propose refuses a command that needs more
// than the cluster version, before it reaches the log. The FSM keeps the
// versions (internal/fsm/version.go); docs/design.md, "Mixed versions",
// says why.

// ApplyVersionHeader is the response header of /readyz that tells which
// command version a node applies. A node without it (older than the gate)
// applies version 1.
const ApplyVersionHeader = "Lockd-Apply-Version"

// Times of the leader's version probes: every member is asked again every
// versionProbeEvery while the cluster version is settled, and sooner
// (backoff from versionRetryBase) while a member did not answer or a raise
// is due; each probe waits versionProbeTimeout at most.
const (
	versionProbeEvery   = 10 * time.Second
	versionRetryBase    = 200 * time.Millisecond
	versionProbeTimeout = 2 * time.Second
)

// ErrUpgradeRequired is what UpgradeRequiredError matches with errors.Is.
var ErrUpgradeRequired = errors.New("upgrade required")

// UpgradeRequiredError refuses a command that needs a higher command
// version than the cluster's: some member may not apply it yet.
type UpgradeRequiredError struct {
	// Needs is the version the command needs.
	Needs uint32
	// Cluster is the cluster version.
	Cluster uint32
	// Behind names the members the leader's last probe found below Needs
	// or could not reach ("" when it has not probed yet).
	Behind []string
}

// Error names the versions and the members behind.
func (e *UpgradeRequiredError) Error() string {
	msg := fmt.Sprintf("this request needs command version %d but the cluster is at version %d: every member must run a lockd that applies version %d first", e.Needs, e.Cluster, e.Needs)
	if len(e.Behind) > 0 {
		msg += " (behind: " + strings.Join(e.Behind, ", ") + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrUpgradeRequired) true.
func (e *UpgradeRequiredError) Is(target error) bool { return target == ErrUpgradeRequired }

// versions is the node's side of the gate: what the leader last learnt of
// the members, and the version this node reports.
type versions struct {
	mu       sync.Mutex
	seen     map[string]uint32 // member id -> apply version (0: no answer), as last probed
	stopOnce sync.Once         // the node stops at most once for a too-high cluster version

	reported atomic.Uint32 // the version /readyz reports; 0: fsm.ApplyVersion (tests set it)

	// probed is closed when this term's first probe round has finished
	// (set before the term's leadership is recorded): until then a
	// refusal would only say the leader has not asked yet.
	probed atomic.Pointer[chan struct{}]
}

// Versions is the version gate's side a node shows the API: the version it
// reports, and the check of a joining node.
type Versions struct{ *Node }

// versionGate is the leader's side of the gate: the check in Propose and
// the probes of the members.
type versionGate struct{ *Node }

// ApplyVersion returns the command version this node reports (on /readyz
// and in Status): fsm.ApplyVersion, unless a test made it report another.
func (s Versions) ApplyVersion() uint32 {
	if v := s.vers.reported.Load(); v != 0 {
		return v
	}
	return fsm.ApplyVersion
}

// check refuses a command that needs more than the cluster version, before
// it reaches the log. A node that has not established its leadership (its
// applied cluster version may be behind the log) answers not-leader
// instead: the caller retries or goes to the leader.
func (s versionGate) check(t fsm.CmdType, m proto.Message) error {
	need := fsm.NeedsVersion(t, m)
	if need <= 1 {
		return nil
	}
	cv := s.fsm.ClusterVersion()
	if need <= cv {
		return nil
	}
	if s.promotedTerm.Load() == 0 {
		return raft.ErrNotLeader
	}
	// A leader just established has not asked its members yet: a request
	// that needs the version they all apply waits for that first round
	// (bounded by one probe's timeout) instead of being refused.
	if p := s.vers.probed.Load(); p != nil {
		t := time.NewTimer(versionProbeTimeout + time.Second)
		select {
		case <-*p:
		case <-t.C:
		}
		t.Stop()
		if cv = s.fsm.ClusterVersion(); need <= cv {
			return nil
		}
	}
	return &UpgradeRequiredError{Needs: need, Cluster: cv, Behind: s.behind(need)}
}

// behind names the members the last probe found below need, or unreachable.
func (s versionGate) behind(need uint32) []string {
	s.vers.mu.Lock()
	defer s.vers.mu.Unlock()
	var out []string
	for id, v := range s.vers.seen {
		switch {
		case v == 0:
			out = append(out, id+" (no answer)")
		case v < need:
			out = append(out, fmt.Sprintf("%s (version %d)", id, v))
		}
	}
	slices.Sort(out)
	return out
}

// CheckJoinVersion refuses a joining node that applies a lower version
// than the cluster's (0: a node older than the gate, version 1): it would
// apply commands it does not understand.
func (s Versions) CheckJoinVersion(v uint32) error {
	v = max(v, 1)
	if cv := s.fsm.ClusterVersion(); v < cv {
		return &UpgradeRequiredError{Needs: cv, Cluster: cv, Behind: []string{fmt.Sprintf("the joining node (version %d)", v)}}
	}
	return nil
}

// clusterVersionChanged is the FSM's hook (under its lock: it must not
// block): a cluster version above what this binary applies stops the node,
// since the next entries may be commands it would decide differently.
func (s versionGate) clusterVersionChanged(v uint32) {
	if v <= fsm.ApplyVersion {
		return
	}
	s.vers.stopOnce.Do(func() {
		go s.fatal(fmt.Errorf("the cluster is at command version %d but this lockd applies only version %d: run a newer lockd on this data dir", v, fsm.ApplyVersion))
	})
}

// probeVersions runs on the leader of the term whose leadership changed
// channel is changed, until it closes or the node stops: it asks every
// member which version it applies, at once, on every membership change and
// every versionProbeEvery (sooner while one did not answer), and raises
// the cluster version when all of them apply a higher one.
func (s versionGate) probeVersions(changed <-chan struct{}) {
	peers := make(chan raft.Observation, 4)
	obs := raft.NewObserver(peers, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.PeerObservation)
		return ok
	})
	s.raft.RegisterObserver(obs)
	defer s.raft.DeregisterObserver(obs)
	ctx, cancel := s.untilClosed()
	defer cancel()
	go func() {
		select {
		case <-changed:
			cancel()
		case <-ctx.Done():
		}
	}()
	fails := 0
	first := s.vers.probed.Load()
	for {
		wait := versionProbeEvery
		if settled, err := s.raiseClusterVersion(ctx); !settled {
			if err != nil {
				s.log.Debug("cluster version not raised yet", "err", err)
			}
			wait = min(versionProbeEvery, versionRetryBase<<min(fails, 6))
			fails++
		} else {
			fails = 0
		}
		if first != nil {
			close(*first)
			first = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-peers:
			t.Stop()
		case <-t.C:
		}
	}
}

// raiseClusterVersion probes every member once and proposes the highest
// version all of them apply when it is above the cluster version. settled
// reports that every member answered and nothing was left to raise.
func (s versionGate) raiseClusterVersion(ctx context.Context) (settled bool, err error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	servers := f.Configuration().Servers
	seen := make([]uint32, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		if string(srv.ID) == s.nodeID {
			seen[i] = Versions(s).ApplyVersion()
			continue
		}
		m, ok := s.fsm.Member(string(srv.ID))
		if !ok || m.API == "" {
			continue // no answer: holds the version back
		}
		wg.Go(func() { seen[i] = s.probeVersion(ctx, m.API) })
	}
	wg.Wait()
	low := uint32(0)
	all := true
	byID := make(map[string]uint32, len(servers))
	for i, srv := range servers {
		byID[string(srv.ID)] = seen[i]
		if seen[i] == 0 {
			all = false
		} else if low == 0 || seen[i] < low {
			low = seen[i]
		}
	}
	s.vers.mu.Lock()
	s.vers.seen = byID
	s.vers.mu.Unlock()
	if !all {
		return false, errors.New("a member did not answer the version probe")
	}
	cv := s.fsm.ClusterVersion()
	if low <= cv {
		// Settled when every member applies what this one does; a member
		// behind (being upgraded, most likely) is asked again sooner.
		return low >= Versions(s).ApplyVersion(), nil
	}
	r, err := s.Propose(fsm.CmdSetClusterVersion, &fsmv1.SetClusterVersion{Version: low})
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return false, fmt.Errorf("propose cluster version %d: %w", low, err)
	}
	s.log.Info("cluster version raised", "from", cv, "to", low, "members", len(servers))
	return true, nil
}

// probeVersion asks the node at api which version it applies: the
// ApplyVersionHeader of its /readyz (any status), 1 without one, 0 when it
// does not answer.
func (s versionGate) probeVersion(ctx context.Context, api string) uint32 {
	ctx, cancel := context.WithTimeout(ctx, versionProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := s.fwd.HTTPClient().Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	h := resp.Header.Get(ApplyVersionHeader)
	if h == "" {
		return 1
	}
	v, err := strconv.ParseUint(h, 10, 32)
	if err != nil || v == 0 {
		return 0
	}
	return uint32(v)
}
