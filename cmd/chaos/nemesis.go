package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Fault kinds. Client faults start with "client-": the checker excuses a
// stale holder's messages only around a pause or kill of its own slot.
const (
	faultKillLeader    = "node-kill-leader"
	faultKillFollower  = "node-kill-follower"
	faultKillRandom    = "node-kill-random"
	faultPauseNode     = "node-pause"
	faultPauseLeader   = "node-pause-leader"      // the leader SIGSTOPped for leaderPause
	faultPartLeader    = "node-partition-leader"  // the leader isolated: a minority leader
	faultPartRandom    = "node-partition-random"  // a random node isolated, both ways
	faultPartInbound   = "node-partition-inbound" // no peer can reach a random node: one-way
	faultPartBridge    = "node-partition-bridge"  // five nodes only: two halves joined by one node
	faultClientPauseGo = "client-pause-go"
	faultClientPauseRn = "client-pause-run"
	faultClientKill    = "client-kill" // prefix of the two below
	faultClientKillGo  = "client-kill-go"
	faultClientKillRn  = "client-kill-run"
	faultRevoke        = "admin-revoke"
	faultClockJump     = "node-clock-jump"      // a node's wall clock minutes forward, then minutes back
	faultPartDelay     = "node-partition-delay" // 200–800 ms latency each way on a node's links to its peers
	faultDiskSlow      = "node-disk-slow"       // every Raft disk write of a random node 100–400 ms late
	faultDiskHang      = "node-disk-hang"       // the leader's Raft disk writes block past the watchdog limit
)

// leaderPause is how long node-pause-leader stops the leader: far longer
// than an election, as in an earlier review's finding (4–8 s pauses), so the clients
// must leave the frozen node for the new leader rather than wait for it
// to come back; the report's unavailabilityMs for the kind shows what it
// cost.
const leaderPause = 7 * time.Second

// allFaults is every kind the tool injects, each once in the short
// profile.
var allFaults = []string{
	faultKillLeader, faultKillFollower, faultKillRandom, faultPauseNode, faultPauseLeader,
	faultPartLeader, faultPartRandom, faultPartInbound, faultPartBridge,
	faultClientPauseGo, faultClientPauseRn, faultClientKillGo, faultClientKillRn, faultRevoke,
	faultClockJump, faultPartDelay, faultDiskSlow, faultDiskHang,
}

// faultsFor lists the kinds the run injects: --faults if given, else every
// kind that applies to the backend (and, on lockd, to a cluster of
// cfg.Nodes).
func faultsFor(cfg *config) []string {
	if len(cfg.Faults) > 0 {
		return slices.Clone(cfg.Faults)
	}
	if isRedis(cfg.Backend) {
		return slices.Clone(redisFaults)
	}
	var out []string
	for _, k := range allFaults {
		if k != faultPartBridge || cfg.Nodes == 5 {
			out = append(out, k)
		}
	}
	return out
}

// ids joins the nodes' ids with "+".
func ids(nodes []*node) string {
	var s []string
	for _, n := range nodes {
		s = append(s, n.id)
	}
	return strings.Join(s, "+")
}

// nemesis injects faults into the cluster and the clients and records each
// as a fault and a heal event in the register's history.
type nemesis struct {
	c      *cluster    // nil on a Redis backend
	rf     *redisFleet // nil on lockd
	t      timing
	reg    *register
	slots  []*slot
	rng    *rand.Rand
	n      int64
	broken string // brokenUnsafeRevoke: revoke with unsafe-now
	log    func(format string, args ...any)
}

func (m *nemesis) record(kind, fault, target, detail string, id int64) {
	_, _ = m.reg.record(Event{Kind: kind, Fault: fault, Target: target, Detail: detail, OpID: id})
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) { pause(ctx, d) }

// inject runs one fault of the kind from injection to heal. It returns
// false when there was nothing to inject it into (no holder to pause).
func (m *nemesis) inject(ctx context.Context, kind string) (bool, error) {
	t := m.t
	m.n++
	id := m.n
	switch kind {
	case faultRedisKill, faultRedisPause:
		return true, m.injectRedis(ctx, kind, id)
	case faultKillLeader, faultKillFollower, faultKillRandom:
		leader := m.c.leader(ctx)
		var cands []*node
		for _, n := range m.c.nodes {
			if kind == faultKillRandom || (kind == faultKillLeader) == (n == leader) {
				cands = append(cands, n)
			}
		}
		if len(cands) == 0 {
			return false, nil
		}
		n := cands[m.rng.IntN(len(cands))]
		m.record(kindFault, kind, n.id, "kill -9", id)
		n.kill()
		sleep(ctx, time.Second+time.Duration(m.rng.IntN(1000))*time.Millisecond)
		if err := m.c.start(ctx, n); err != nil {
			return true, fmt.Errorf("restart %s: %w", n.id, err)
		}
		m.record(kindHeal, kind, n.id, "restarted", id)
	case faultPauseNode, faultPauseLeader:
		n := m.c.nodes[m.rng.IntN(len(m.c.nodes))]
		d := t.TTL + t.Grace + time.Second
		if kind == faultPauseLeader {
			if n = m.c.leader(ctx); n == nil {
				return false, nil
			}
			d = leaderPause
		}
		m.record(kindFault, kind, n.id, "SIGSTOP "+d.String(), id)
		n.signal(syscall.SIGSTOP)
		sleep(ctx, d)
		n.signal(syscall.SIGCONT)
		m.record(kindHeal, kind, n.id, "SIGCONT", id)
	case faultPartLeader, faultPartRandom, faultPartInbound:
		n := m.c.nodes[m.rng.IntN(len(m.c.nodes))]
		if kind == faultPartLeader {
			if n = m.c.leader(ctx); n == nil {
				return false, nil
			}
		}
		minority := []*node{n}
		if len(m.c.nodes) == 5 && kind == faultPartLeader {
			// Five nodes: the leader and one follower, a minority of two.
			for len(minority) < 2 {
				if f := m.c.nodes[m.rng.IntN(5)]; f != n {
					minority = append(minority, f)
				}
			}
		}
		var others []*node
		for _, o := range m.c.nodes {
			if !slices.Contains(minority, o) {
				others = append(others, o)
			}
		}
		d := t.TTL + time.Second
		if kind == faultPartInbound {
			// No peer can open a connection to the node; its own
			// connections to them still work (both ways, as TCP does).
			m.record(kindFault, kind, n.id, "peers cannot reach it for "+d.String(), id)
			m.c.partition(others, []*node{n}, false)
		} else {
			m.record(kindFault, kind, ids(minority), "isolated from the others for "+d.String(), id)
			m.c.partition(minority, others, true)
		}
		sleep(ctx, d)
		seen := "none"
		if st, err := status(ctx, others[0].url()); err == nil && st.GetLeader() != "" {
			seen = st.GetLeader()
		}
		m.c.heal()
		target := ids(minority)
		if kind == faultPartInbound {
			target = n.id
		}
		m.record(kindHeal, kind, target, "healed; the others' leader was "+seen, id)
		m.log("%s of %s healed; the others' leader was %s", kind, n.id, seen)
		if kind != faultPartInbound && seen == n.id {
			// The proxies did not cut it off: the run would prove less
			// than it claims.
			return true, fmt.Errorf("partition ineffective: %s isolated for %v, the others still follow it", n.id, d)
		}
	case faultPartDelay:
		// A slow network, not a cut: every byte between the node and its
		// peers (Raft, forwarded calls) arrives late, a different amount
		// each way. Clients reach it directly, at full speed.
		n := m.c.nodes[m.rng.IntN(len(m.c.nodes))]
		var others []*node
		for _, o := range m.c.nodes {
			if o != n {
				others = append(others, o)
			}
		}
		out := time.Duration(200+m.rng.IntN(601)) * time.Millisecond
		in := time.Duration(200+m.rng.IntN(601)) * time.Millisecond
		d := t.TTL + time.Second
		m.record(kindFault, kind, n.id, fmt.Sprintf("links to its peers delayed %v out, %v in, for %v", out, in, d), id)
		m.c.delay(n, others, out, in)
		sleep(ctx, d)
		m.c.heal()
		m.record(kindHeal, kind, n.id, "healed", id)
	case faultClockJump:
		// The node's wall clock (wallclock.Now, through its offset file)
		// jumps minutes forward, then as far back behind the real time;
		// leases and timers run on the monotonic clock and must not notice.
		n := m.c.nodes[m.rng.IntN(len(m.c.nodes))]
		jump := time.Duration(2+m.rng.IntN(4)) * time.Minute
		d := t.TTL + t.Grace + time.Second
		m.record(kindFault, kind, n.id, fmt.Sprintf("wall clock +%v for %v, then -%v for %v", jump, d, jump, d), id)
		err := os.WriteFile(n.wall, []byte(jump.String()), 0o600)
		sleep(ctx, d)
		if err == nil {
			err = os.WriteFile(n.wall, []byte((-jump).String()), 0o600)
		}
		sleep(ctx, d)
		if rerr := os.Remove(n.wall); err == nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
		m.record(kindHeal, kind, n.id, "wall clock back to real time", id)
		if err != nil {
			return true, fmt.Errorf("clock jump of %s: %w", n.id, err)
		}
	case faultDiskSlow, faultDiskHang:
		return m.injectDisk(ctx, kind, id)
	case faultPartBridge:
		// Five nodes as A B | C | D E: C talks to both sides, the sides
		// not to each other. Raft keeps a leader that C follows.
		order := m.rng.Perm(len(m.c.nodes))
		p := make([]*node, len(order))
		for i, k := range order {
			p[i] = m.c.nodes[k]
		}
		d := t.TTL + time.Second
		m.record(kindFault, kind, p[2].id, fmt.Sprintf("bridge %s %s | %s | %s %s for %v", p[0].id, p[1].id, p[2].id, p[3].id, p[4].id, d), id)
		m.c.partition(p[:2], p[3:], true)
		sleep(ctx, d)
		m.c.heal()
		m.record(kindHeal, kind, p[2].id, "healed", id)
	case faultClientPauseGo, faultClientPauseRn, faultClientKillGo, faultClientKillRn:
		want := "go"
		if strings.HasSuffix(kind, "-run") {
			want = "run"
		}
		s := m.pickHolder(ctx, want)
		if s == nil {
			return false, nil
		}
		if strings.HasPrefix(kind, faultClientKill) {
			m.record(kindFault, kind, s.name, "kill -9", id)
			s.signal(syscall.SIGKILL)
			// Healed when its lease has surely run out on the server.
			sleep(ctx, t.TTL+t.Grace)
			m.record(kindHeal, kind, s.name, "lease over", id)
			break
		}
		d := t.TTL + t.Grace + 1500*time.Millisecond
		m.record(kindFault, kind, s.name, "SIGSTOP "+d.String(), id)
		s.signal(syscall.SIGSTOP)
		sleep(ctx, d)
		s.signal(syscall.SIGCONT)
		m.record(kindHeal, kind, s.name, "SIGCONT", id)
	case faultRevoke:
		// lockd release --force: the holder's session is revoked, and the
		// lock is granted again only after TTL + grace (at once with
		// --broken unsafe-revoke, which breaks mutual exclusion).
		s := m.pickHolder(ctx, "")
		if s == nil {
			return false, nil
		}
		lock := m.reg.lockOf(s.name)
		unsafe := m.broken == brokenUnsafeRevoke
		m.record(kindFault, kind, "*", fmt.Sprintf("force-release %s (unsafe-now %v)", lock, unsafe), id)
		err := m.forceRelease(ctx, lock, unsafe)
		sleep(ctx, t.TTL+t.Grace)
		m.record(kindHeal, kind, "*", fmt.Sprint(err), id)
	default:
		return false, fmt.Errorf("unknown fault kind %q", kind)
	}
	return true, nil
}

// pickHolder waits up to 5 s for a slot of the kind ("" any) that is in a
// critical section, and returns one at random.
func (m *nemesis) pickHolder(ctx context.Context, kind string) *slot {
	var found *slot
	_ = poll(ctx, 5*time.Second, 5*time.Millisecond, func() (bool, error) {
		holding := m.reg.holding()
		var cands []*slot
		for _, s := range m.slots {
			if (kind == "" || s.kind == kind) && slices.Contains(holding, s.name) {
				cands = append(cands, s)
			}
		}
		if len(cands) > 0 {
			found = cands[m.rng.IntN(len(cands))]
		}
		return found != nil, nil
	})
	return found
}

func (m *nemesis) forceRelease(ctx context.Context, lock string, unsafe bool) error {
	var last error
	for _, url := range m.c.endpoints() {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := lockdv1connect.NewLockServiceClient(statusHTTP, url).ForceRelease(cctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: lock, UnsafeNow: unsafe}))
		cancel()
		if err == nil {
			return nil
		}
		last = err
	}
	return last
}
