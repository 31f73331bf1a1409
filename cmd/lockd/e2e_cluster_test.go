package main

// End-to-end tests of a three-node cluster of real `lockd serve` processes
// on 127.0.0.1: kill -9 of the leader under `lockd
// run` clients spread over all endpoints keeps mutual exclusion and every
// acknowledged grant, and the restarted node rejoins; and the membership
// commands (lockd members, members remove, leader transfer), including a
// wiped node coming back under a new id.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/proctest"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// clusterNode is one node of a test cluster: its identity and addresses
// stay while its process is killed and restarted.
type clusterNode struct {
	id, data, api, raft string
	join                string   // --join; "" for the bootstrap node
	extra               []string // more serve flags
	srv                 *lockdServer
}

func (n *clusterNode) url() string { return "http://" + n.api }

// start starts the node's process (again) and waits until it serves its
// API; a joining node does so once the leader has added it.
func (n *clusterNode) start(t *testing.T) {
	t.Helper()
	args := []string{"--node-id", n.id}
	if n.join != "" {
		args = append(args, "--join", n.join)
	}
	args = append(args, n.extra...)
	n.srv = startNode(t, n.data, n.api, n.raft, "/healthz", args...)
}

// kill sends SIGKILL and waits for the process to be gone.
func (n *clusterNode) kill(t *testing.T) {
	t.Helper()
	if err := n.srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.srv.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("node %s still running 10s after kill -9", n.id)
	}
}

type testCluster struct {
	nodes []*clusterNode
}

// startCluster starts n1 (bootstrap), then n2… joining through n1, with
// extra serve flags, and waits until every node sees the same leader and n
// voters.
func startCluster(t *testing.T, n int, extra ...string) *testCluster {
	t.Helper()
	needBinary(t)
	dir := t.TempDir()
	c := &testCluster{}
	for i := range n {
		node := &clusterNode{
			id:   fmt.Sprintf("n%d", i+1),
			data: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			api:  freePort(t),
			raft: freePort(t),
		}
		if i > 0 {
			node.join = c.nodes[0].url()
		}
		node.extra = extra
		c.nodes = append(c.nodes, node)
	}
	start := time.Now()
	for _, node := range c.nodes {
		node.start(t)
	}
	leader := c.waitStable(t, c.nodes, 30*time.Second)
	t.Logf("%d-node cluster up in %v, leader %s", n, time.Since(start).Round(time.Millisecond), leader)
	return c
}

func (c *testCluster) node(id string) *clusterNode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// endpoints lists the nodes' URLs in the given order of indexes.
func (c *testCluster) endpoints(order ...int) string {
	var urls []string
	for _, i := range order {
		urls = append(urls, c.nodes[i].url())
	}
	return strings.Join(urls, ",")
}

var statusHTTP = &http.Client{Timeout: 2 * time.Second}

// nodeStatus asks one node for its Status (a local read, no forwarding).
func nodeStatus(url string) (*lockdv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := lockdv1connect.NewLockServiceClient(statusHTTP, url).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// stable reports the leader when every node in live answers, names the same
// leader, and that leader's member list is exactly live, all voters.
func stable(live []*clusterNode) (string, string) {
	leader := ""
	var leaderView *lockdv1.StatusResponse
	for _, n := range live {
		st, err := nodeStatus(n.url())
		if err != nil {
			return "", fmt.Sprintf("%s: %v", n.id, err)
		}
		if st.GetLeader() == "" || leader != "" && st.GetLeader() != leader {
			return "", fmt.Sprintf("%s sees leader %q, others %q", n.id, st.GetLeader(), leader)
		}
		leader = st.GetLeader()
		if st.GetNodeId() == leader {
			leaderView = st
		}
	}
	if leaderView == nil {
		return "", fmt.Sprintf("leader %q is not one of the live nodes", leader)
	}
	var want, got []string
	for _, n := range live {
		want = append(want, n.id)
	}
	for _, m := range leaderView.GetMembers() {
		if !m.GetVoter() {
			return "", fmt.Sprintf("%s is not a voter yet", m.GetId())
		}
		got = append(got, m.GetId())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return "", fmt.Sprintf("members %v, want %v", got, want)
	}
	return leader, ""
}

// waitStable polls until live is a stable cluster (see stable) and returns
// its leader.
func (c *testCluster) waitStable(t *testing.T, live []*clusterNode, timeout time.Duration) string {
	t.Helper()
	var leader, why string
	if !pollEvery(timeout, 20*time.Millisecond, func() bool {
		leader, why = stable(live)
		return leader != ""
	}) {
		t.Fatalf("cluster not stable within %v: %s", timeout, why)
	}
	return leader
}

// pollEvery is poll with a given interval, for conditions that cost a
// process or a network call.
func pollEvery(timeout, every time.Duration, cond func() bool) bool {
	return proctest.Poll(timeout, every, cond)
}

// lockdCLI runs `lockd ARGS...` with LOCKD_ENDPOINTS=endpoints, bounded in
// time, and returns stdout, stderr and the exit status.
func lockdCLI(t *testing.T, endpoints string, args ...string) (string, string, int) {
	t.Helper()
	return tlsCLI(t, "", []string{"LOCKD_ENDPOINTS=" + endpoints}, args...)
}

// leaderTransfer runs lockd leader transfer [TO] on a cluster led by
// leader until it does not time out, at most five times within a minute,
// the cluster stable before each: on a loaded machine the target may not
// catch up within Raft's transfer timeout, and the CLI then exits 1 saying
// so (which an operator meets too, and retries, as here). moved reports a
// timed-out transfer that took effect after all (the leader changed, to
// the target if one is named): then nothing is retried. Any other outcome
// is returned at once.
func (c *testCluster) leaderTransfer(t *testing.T, endpoints, leader string, to ...string) (out, errOut string, code int, moved bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for attempt := 1; ; attempt++ {
		out, errOut, code = lockdCLI(t, endpoints, append([]string{"leader", "transfer"}, to...)...)
		if code == 0 || !strings.Contains(errOut, "leadership transfer timeout") || attempt == 5 || time.Now().After(deadline) {
			return out, errOut, code, false
		}
		t.Logf("lockd leader transfer %v, attempt %d: %s", to, attempt, strings.TrimSpace(errOut))
		if l := c.waitStable(t, c.nodes, 20*time.Second); l != leader && (len(to) == 0 || l == to[0]) {
			t.Logf("the timed-out transfer took effect after all: leader %s", l)
			return out, errOut, code, true
		}
	}
}

// countLines counts the lines of file that start with prefix.
func countLines(file, prefix string) int {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			n++
		}
	}
	return n
}

// Acceptance 4: three real nodes; `lockd run` clients spread over every
// endpoint (in different orders) take one lock in turn, logging their
// critical sections, while other `lockd run` clients hold locks throughout.
// kill -9 the leader and restart it on its data dir and ports: a new leader
// is elected, the restarted node rejoins as a follower, the shared log shows
// no overlap and strictly increasing tokens, every run succeeds, and every
// long hold keeps its token and session.
func TestClusterLeaderKill(t *testing.T) {
	c := startCluster(t, 3)
	orders := []string{c.endpoints(0, 1, 2), c.endpoints(1, 2, 0), c.endpoints(2, 0, 1)}
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")

	// Long holds, one through each endpoint order.
	type hold struct {
		name, file string
		run        *runProc
		token      uint64
		session    string
	}
	var holds []*hold
	for i, eps := range orders {
		h := &hold{name: fmt.Sprintf("cluster/hold-%d", i), file: filepath.Join(dir, fmt.Sprintf("hold-%d", i))}
		h.run = startRunAt(t, eps, "--ttl", "5s", h.name, "--", "sh", "-c",
			`echo $LOCKD_TOKEN $LOCKD_SESSION > "`+h.file+`"; while [ ! -e "`+stop+`" ]; do sleep 0.05; done`)
		holds = append(holds, h)
	}
	for _, h := range holds {
		f := readFields(t, h.file, 2, 20*time.Second)
		h.token, h.session = parseToken(t, f[0]), f[1]
	}

	// Workers: each runs `lockd run` on one lock again and again, through
	// its own endpoint order, until told to stop.
	logFile := filepath.Join(dir, "log")
	t.Setenv("LOG", logFile)
	script := `echo "start $LOCKD_TOKEN $LOCKD_SESSION" >> "$LOG"; sleep 0.03; echo "end $LOCKD_TOKEN $LOCKD_SESSION" >> "$LOG"`
	const workers = 6
	var (
		stopWorkers atomic.Bool
		succeeded   atomic.Int64
		wg          sync.WaitGroup
		runningMu   sync.Mutex
		running     = map[*runProc]bool{}
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stopWorkers.Load(); i++ {
				eps := orders[(w+i)%len(orders)]
				p := startRunAt(t, eps, "--ttl", "5s", "--wait", "60s", "cluster/mutex", "--", "sh", "-c", script)
				runningMu.Lock()
				running[p] = true
				runningMu.Unlock()
				select {
				case <-p.done:
				case <-time.After(90 * time.Second):
					t.Errorf("worker %d: lockd run still running after 90s: %s", w, p.output())
					return
				}
				runningMu.Lock()
				delete(running, p)
				runningMu.Unlock()
				if p.err != nil {
					if !stopWorkers.Load() || !t.Failed() {
						t.Errorf("worker %d: lockd run via %s: %v: %s", w, eps, p.err, p.output())
					}
					return
				}
				succeeded.Add(1)
			}
		})
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	// Deferred, so it runs before the cleanups, on t.Fatal too: no worker
	// may outlive the test.
	defer func() {
		stopWorkers.Store(true)
		if t.Failed() {
			runningMu.Lock()
			for p := range running {
				_ = p.cmd.Process.Kill()
			}
			runningMu.Unlock()
		}
		select {
		case <-workersDone:
		case <-time.After(2 * time.Minute):
			t.Error("workers still running 2 minutes after they were told to stop")
		}
	}()
	sections := func() int { return countLines(logFile, "end ") }
	waitSections := func(n int, what string) {
		t.Helper()
		if !pollEvery(60*time.Second, 10*time.Millisecond, func() bool { return sections() >= n }) {
			t.Fatalf("%s: %d critical sections, want %d within 60s", what, sections(), n)
		}
	}
	waitSections(10, "before the kill")

	// kill -9 the leader.
	oldLeader, _ := stable(c.nodes)
	if oldLeader == "" {
		t.Fatal("no stable leader before the kill")
	}
	victim := c.node(oldLeader)
	var survivors []*clusterNode
	for _, n := range c.nodes {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	startsAtKill := countLines(logFile, "start ")
	killed := time.Now()
	victim.kill(t)

	// A new leader among the survivors.
	var newLeader string
	if !pollEvery(30*time.Second, 5*time.Millisecond, func() bool {
		st, err := nodeStatus(survivors[0].url())
		if err != nil || st.GetLeader() == "" || st.GetLeader() == oldLeader {
			return false
		}
		newLeader = st.GetLeader()
		return true
	}) {
		t.Fatalf("no new leader within 30s of killing %s", oldLeader)
	}
	elected := time.Since(killed)
	// At most one start after the kill can come from a grant made before
	// it, so the second one shows the new leader granting.
	if !pollEvery(60*time.Second, 5*time.Millisecond, func() bool { return countLines(logFile, "start ") >= startsAtKill+2 }) {
		t.Fatalf("no new grant within 60s of killing the leader")
	}
	resumed := time.Since(killed)

	// Restart the old leader on its data dir and ports: it rejoins as a
	// follower of the new leader.
	victim.start(t)
	restarted := time.Since(killed)
	var rejoinWhy string
	if !pollEvery(30*time.Second, 10*time.Millisecond, func() bool {
		leader, why := stable(c.nodes)
		if leader == "" {
			rejoinWhy = why
			return false
		}
		st, err := nodeStatus(victim.url())
		if err != nil || st.GetState() != "Follower" {
			rejoinWhy = fmt.Sprintf("%s: state %q, err %v", victim.id, st.GetState(), err)
			return false
		}
		return true
	}) {
		t.Fatalf("%s did not rejoin as a follower within 30s: %s", victim.id, rejoinWhy)
	}
	rejoined := time.Since(killed)
	t.Logf("killed leader %s: %s elected after %v; next grant after %v; %s restarted after %v, follower again after %v",
		oldLeader, newLeader, elected.Round(time.Millisecond), resumed.Round(time.Millisecond),
		victim.id, restarted.Round(time.Millisecond), rejoined.Round(time.Millisecond))

	// More grants with the restarted node back, then stop the workers.
	waitSections(sections()+10, "after the rejoin")
	stopWorkers.Store(true)
	select {
	case <-workersDone:
	case <-time.After(2 * time.Minute):
		t.Fatal("workers still running 2 minutes after they were told to stop")
	}
	if t.Failed() {
		t.FailNow()
	}
	n := int(succeeded.Load())
	checkLog(t, logFile, n)
	t.Logf("%d critical sections through %d endpoints orders: no overlap, tokens strictly increasing", n, len(orders))

	// Every long hold kept its grant through the failover, as every node
	// tells (reads forwarded to the leader).
	var maxToken uint64
	for _, h := range holds {
		maxToken = max(maxToken, h.token)
		for _, node := range c.nodes {
			l := describe(t, node.srv, h.name)
			if l == nil || len(l.Holders) != 1 || l.Holders[0].Token != strconv.FormatUint(h.token, 10) || l.Holders[0].SessionID != h.session {
				t.Errorf("%s via %s: %+v, want held by session %s with token %d", h.name, node.id, l, h.session, h.token)
			}
		}
		select {
		case <-h.run.done:
			t.Errorf("lockd run holding %s exited during the failover: %s", h.name, h.run.output())
		default:
		}
	}
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, h := range holds {
		if code := h.run.wait(t, 20*time.Second); code != 0 {
			t.Errorf("lockd run holding %s: exit status %d: %s", h.name, code, h.run.output())
		}
	}

	// Every node, the restarted one included, ends up with the same state:
	// the same applied index and the last token at or above every token
	// handed out.
	f, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(f)), "\n") {
		maxToken = max(maxToken, parseToken(t, strings.Fields(line)[1]))
	}
	var why string
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		var applied []uint64
		for _, node := range c.nodes {
			st, err := nodeStatus(node.url())
			if err != nil {
				why = err.Error()
				return false
			}
			if st.GetLastToken() < maxToken {
				why = fmt.Sprintf("%s: last token %d < %d", node.id, st.GetLastToken(), maxToken)
				return false
			}
			applied = append(applied, st.GetAppliedIndex())
		}
		why = fmt.Sprintf("applied indexes %v", applied)
		return slices.Min(applied) == slices.Max(applied)
	}) {
		t.Errorf("nodes did not converge within 20s: %s", why)
	}
}

// membersJSON is `lockd members --json`.
type membersJSON struct {
	ClusterID string `json:"clusterId"`
	Leader    string `json:"leader"`
	Members   []struct {
		ID    string `json:"id"`
		API   string `json:"api"`
		Raft  string `json:"raft"`
		Role  string `json:"role"`
		Voter bool   `json:"voter"`
	} `json:"members"`
}

// The membership commands against a live three-node cluster: lockd members
// in text and JSON, leader transfer to any voter and to a named one, the
// refusals, removing a stopped follower, and a wiped node coming back under
// a new id on the same ports (its old membership removed first), both after
// an explicit remove and without one.
func TestClusterMembership(t *testing.T) {
	c := startCluster(t, 3)
	all := c.endpoints(0, 1, 2)
	leader, _ := stable(c.nodes)
	var follower *clusterNode
	for _, n := range c.nodes {
		if n.id != leader {
			follower = n
			break
		}
	}

	// lockd members, through a follower.
	out, errOut, code := lockdCLI(t, follower.url(), "members")
	if code != 0 {
		t.Fatalf("lockd members: exit status %d: %s", code, errOut)
	}
	t.Logf("lockd members:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !slices.Equal(strings.Fields(lines[0]), []string{"ID", "ROLE", "VOTER", "API", "RAFT"}) {
		t.Fatalf("lockd members: %q, want a header and 3 rows", out)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		n := c.node(f[0])
		role := "follower"
		if f[0] == leader {
			role = "leader"
		}
		if n == nil || len(f) != 5 || f[1] != role || f[2] != "yes" || f[3] != n.url() || f[4] != n.raft {
			t.Errorf("lockd members row %q, want %s %s yes %s %s", line, f[0], role, n.url(), n.raft)
		}
	}
	members := func(endpoints string) membersJSON {
		t.Helper()
		out, errOut, code := lockdCLI(t, endpoints, "members", "--json")
		if code != 0 {
			t.Fatalf("lockd members --json: exit status %d: %s", code, errOut)
		}
		var m membersJSON
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("lockd members --json: %v: %s", err, out)
		}
		return m
	}
	m := members(all)
	if m.Leader != leader || m.ClusterID == "" || len(m.Members) != 3 {
		t.Errorf("lockd members --json: %+v, want leader %s, a cluster id and 3 members", m, leader)
	}
	for _, mm := range m.Members {
		if n := c.node(mm.ID); n == nil || mm.API != n.url() || mm.Raft != n.raft || !mm.Voter {
			t.Errorf("lockd members --json: member %+v, want one of the nodes, a voter", mm)
		}
	}

	// lockd leader transfer, to any voter, through a follower listed after
	// an unreachable endpoint.
	dead := "http://" + freePort(t)
	start := time.Now()
	out, errOut, code, moved := c.leaderTransfer(t, dead+","+follower.url(), leader)
	if !moved && (code != 0 || !strings.Contains(out, "leadership transferred from "+leader+" to ")) {
		t.Fatalf("lockd leader transfer: exit status %d: %s%s", code, out, errOut)
	}
	t.Logf("lockd leader transfer in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	newLeader := c.waitStable(t, c.nodes, 20*time.Second)
	if newLeader == leader {
		t.Errorf("leader after transfer is still %s", leader)
	}
	if want := strings.TrimSpace(out[strings.LastIndex(out, " ")+1:]); !moved && want != newLeader {
		t.Errorf("lockd leader transfer said %q, cluster says %s", want, newLeader)
	}
	leader = newLeader

	// To a named voter.
	var target *clusterNode
	for _, n := range c.nodes {
		if n.id != leader {
			target = n
		}
	}
	out, errOut, code, moved = c.leaderTransfer(t, all, leader, target.id)
	if !moved && (code != 0 || !strings.Contains(out, "to "+target.id)) {
		t.Fatalf("lockd leader transfer %s: exit status %d: %s%s", target.id, code, out, errOut)
	}
	if leader = c.waitStable(t, c.nodes, 20*time.Second); leader != target.id {
		t.Errorf("leader after transfer to %s: %s", target.id, leader)
	}

	// Refusals: exit 64 with one line saying why; nothing changes.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"leader", "transfer", "nosuch"}, "not a voter"},
		{[]string{"members", "remove", "nosuch"}, "not a member"},
		{[]string{"members", "remove", leader}, "is the leader"},
		{[]string{"members", "remove"}, "usage"},
	} {
		_, errOut, code := lockdCLI(t, all, tt.args...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("lockd %s: exit status %d, stderr %q; want %d and one line mentioning %q", strings.Join(tt.args, " "), code, errOut, exitUsage, tt.want)
		}
	}
	if l := c.waitStable(t, c.nodes, 10*time.Second); l != leader {
		t.Errorf("leader changed to %s after the refusals", l)
	}

	// Stop a follower and remove it; the two left serve.
	var gone, other *clusterNode
	for _, n := range c.nodes {
		switch {
		case n.id == leader:
		case gone == nil:
			gone = n
		default:
			other = n
		}
	}
	gone.kill(t)
	live := []*clusterNode{c.node(leader), other}
	out, errOut, code = lockdCLI(t, c.endpoints(slices.Index(c.nodes, gone), slices.Index(c.nodes, other), slices.Index(c.nodes, c.node(leader))), "members", "remove", gone.id)
	if code != 0 || strings.TrimSpace(out) != "removed member "+gone.id {
		t.Fatalf("lockd members remove %s: exit status %d: %s%s", gone.id, code, out, errOut)
	}
	c.waitStable(t, live, 10*time.Second)
	if m := members(all); len(m.Members) != 2 {
		t.Errorf("members after removing %s: %+v", gone.id, m.Members)
	}
	if p := startRunAt(t, all, "--no-wait", "cluster/after-remove", "--", "true"); p.wait(t, 20*time.Second) != 0 {
		t.Errorf("two-node cluster does not grant: %s", p.output())
	}

	// A wiped node comes back under a new id on the same ports.
	rejoin := func(old *clusterNode, newID string) {
		t.Helper()
		if err := os.RemoveAll(old.data); err != nil {
			t.Fatal(err)
		}
		// --join lists the other nodes: a node's own URL in the list
		// stalls each join round (see the report on joinCluster).
		var others []int
		for i, n := range c.nodes {
			if n != old {
				others = append(others, i)
			}
		}
		old.id, old.join = newID, c.endpoints(others...)
		start := time.Now()
		old.start(t)
		c.waitStable(t, c.nodes, 30*time.Second)
		t.Logf("wiped node back as %s, a voter, %v after its start", newID, time.Since(start).Round(time.Millisecond))
	}
	oldID := gone.id
	rejoin(gone, gone.id+"-b")
	// And without removing it first: the leader drops the member with the
	// same Raft address before adding the new one.
	oldOther := other.id
	other.kill(t)
	rejoin(other, other.id+"-b")
	m = members(all)
	for _, mm := range m.Members {
		if mm.ID == oldID || mm.ID == oldOther {
			t.Errorf("old member %s still listed: %+v", mm.ID, m.Members)
		}
	}
	if p := startRunAt(t, all, "--no-wait", "cluster/after-rejoin", "--", "true"); p.wait(t, 20*time.Second) != 0 {
		t.Errorf("cluster does not grant after the rejoins: %s", p.output())
	}
}
