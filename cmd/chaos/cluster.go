package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/diskfault"
	"github.com/lockd-dev/lockd/internal/wallclock"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// timing is the cluster's and the clients' timing, short so faults bite
// within seconds.
type timing struct {
	Election time.Duration // --heartbeat-timeout and --election-timeout
	Grace    time.Duration // --grace
	TTL      time.Duration // client session TTL
	Watchdog time.Duration // --watchdog-timeout: a leader whose proposals stall this long exits
}

// node is one `lockd serve` process: its identity, data dir and ports stay
// while the process is killed and restarted.
type node struct {
	id, data, api, raft string
	wall                string // the node's wall-clock offset file (wallclock.EnvOffsetFile)
	disk                string // the node's disk delay file (diskfault.EnvDelayFile)
	raftProxy, apiProxy *proxy // what the other nodes dial
	join                string
	log                 string
	proc                // the running `lockd serve`
}

func (n *node) url() string { return "http://" + n.api }

// cluster is the real cluster under test.
type cluster struct {
	bin    string
	dir    string
	timing timing
	nodes  []*node
	mu     sync.Mutex
	cuts   map[[2]string]bool          // (from, to) node ids whose connections the proxies drop
	delays map[[2]string]time.Duration // (from, to) node ids: latency the proxies add to those bytes
}

// delayOf returns the latency added to bytes from node from to node to.
func (c *cluster) delayOf(from, to string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.delays[[2]string{from, to}]
}

// delay sets the latency of the bytes between a and each node of others:
// out from a to them, in from them to a.
func (c *cluster) delay(a *node, others []*node, out, in time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range others {
		c.delays[[2]string{a.id, o.id}] = out
		c.delays[[2]string{o.id, a.id}] = in
	}
}

// isCut reports whether connections from src to dst are cut. A source
// that is no node (the tool, a client) is never cut.
func (c *cluster) isCut(src, dst string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return src != "" && c.cuts[[2]string{src, dst}]
}

// partition cuts every connection from a node of from to a node of to
// (both ways if both is set); heal undoes every cut.
func (c *cluster) partition(from, to []*node, both bool) {
	c.mu.Lock()
	for _, a := range from {
		for _, b := range to {
			c.cuts[[2]string{a.id, b.id}] = true
			if both {
				c.cuts[[2]string{b.id, a.id}] = true
			}
		}
	}
	c.mu.Unlock()
	for _, n := range c.nodes {
		n.raftProxy.enforce()
		n.apiProxy.enforce()
	}
}

func (c *cluster) heal() {
	c.mu.Lock()
	clear(c.cuts)
	clear(c.delays)
	c.mu.Unlock()
}

// owner returns the id of the node whose process has the TCP socket from
// port to peer, or "" (a connection from the tool or a client).
func (c *cluster) owner(port, peer int) string {
	inode, err := socketInode(port, peer)
	if err != nil {
		return ""
	}
	for _, n := range c.nodes {
		n.mu.Lock()
		cmd := n.cmd
		n.mu.Unlock()
		if cmd != nil && cmd.Process != nil && ownsSocket(cmd.Process.Pid, inode) {
			return n.id
		}
	}
	return ""
}

// freeAddr returns a free 127.0.0.1 port (closed again, for the node to
// listen on).
//
// The port is taken below the kernel's ephemeral range: a node keeps its
// ports across restarts, and a port from that range could meanwhile be
// handed to any other process's listener or outgoing connection (seen in
// CI: "bind: address already in use" while other test packages ran).
func freeAddr() (string, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const floor = 10000
	for range 200 {
		if low <= floor+1000 {
			break
		}
		port := floor + rand.IntN(low-floor)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// buildBinary builds ./cmd/lockd (the module of this source tree) into dir,
// with the build tag lockdfault: the disk-fault and wall-clock hooks the
// node-disk-* and node-clock-jump faults drive are compiled only into such
// a build, never into a release binary.
func buildBinary(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "lockd")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "lockdfault", "-o", bin, "github.com/lockd-dev/lockd/cmd/lockd")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/lockd: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// newCluster lays out n nodes (ports, data dirs, proxies) without starting
// them. Each node advertises the addresses of its own proxies, so every
// connection another node opens to it, Raft and forwarded API calls,
// passes a proxy the tool can cut. Clients talk to the API directly.
func newCluster(bin, dir string, n int, t timing) (*cluster, error) {
	c := &cluster{bin: bin, dir: dir, timing: t, cuts: map[[2]string]bool{}, delays: map[[2]string]time.Duration{}}
	for i := range n {
		nd := &node{id: fmt.Sprintf("n%d", i+1), data: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), log: filepath.Join(dir, fmt.Sprintf("n%d.log", i+1)),
			wall: filepath.Join(dir, fmt.Sprintf("n%d.wall", i+1)), disk: filepath.Join(dir, fmt.Sprintf("n%d.disk", i+1))}
		var err error
		if nd.api, err = freeAddr(); err != nil {
			return nil, err
		}
		if nd.raft, err = freeAddr(); err != nil {
			return nil, err
		}
		if nd.raftProxy, err = newProxy(nd.raft, nd.id, c.isCut, c.delayOf, c.owner); err != nil {
			return nil, err
		}
		if nd.apiProxy, err = newProxy(nd.api, nd.id, c.isCut, c.delayOf, c.owner); err != nil {
			return nil, err
		}
		if i > 0 {
			nd.join = c.nodes[0].url()
		}
		c.nodes = append(c.nodes, nd)
	}
	return c, nil
}

// start starts (or restarts) the node's process and waits until it answers
// /healthz (a joining node: once the leader added it).
func (c *cluster) start(ctx context.Context, n *node) error {
	args := []string{"serve", "--node-id", n.id, "--data-dir", n.data,
		"--listen", n.api, "--raft-listen", n.raft,
		"--advertise", "http://" + n.apiProxy.addr(), "--raft-advertise", n.raftProxy.addr(),
		"--heartbeat-timeout", c.timing.Election.String(), "--election-timeout", c.timing.Election.String(),
		"--grace", c.timing.Grace.String(), "--min-ttl", "500ms", "--log-level", "warn"}
	if c.timing.Watchdog > 0 {
		args = append(args, "--watchdog-timeout", c.timing.Watchdog.String())
	}
	if n.join != "" {
		args = append(args, "--join", n.join)
	}
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), wallclock.EnvOffsetFile+"="+n.wall, diskfault.EnvDelayFile+"="+n.disk)
	cmd.Stdout, cmd.Stderr = logf, logf
	exited, err := n.start(cmd)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: time.Second}
	return poll(ctx, 30*time.Second, 20*time.Millisecond, func() (bool, error) {
		select {
		case <-exited:
			b, _ := os.ReadFile(n.log)
			return false, fmt.Errorf("node %s exited: %s", n.id, lastLines(string(b), 5))
		default:
		}
		resp, err := hc.Get(n.url() + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// poll calls cond every interval until it is true, fails, or timeout or
// ctx ends.
func poll(ctx context.Context, timeout, every time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", timeout, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

var statusHTTP = &http.Client{Timeout: 2 * time.Second}

// status asks one node for its own view (no forwarding).
func status(ctx context.Context, url string) (*lockdv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := lockdv1connect.NewLockServiceClient(statusHTTP, url).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// leader returns the node every answering node names as leader, or nil.
func (c *cluster) leader(ctx context.Context) *node {
	for _, n := range c.nodes {
		st, err := status(ctx, n.url())
		if err != nil || st.GetLeader() == "" {
			continue
		}
		for _, l := range c.nodes {
			if l.id == st.GetLeader() {
				return l
			}
		}
	}
	return nil
}

// waitStable waits until every node answers and names one leader, and the
// leader lists every node as a voter.
func (c *cluster) waitStable(ctx context.Context, timeout time.Duration) error {
	var why string
	err := poll(ctx, timeout, 50*time.Millisecond, func() (bool, error) {
		leader := ""
		for _, n := range c.nodes {
			st, err := status(ctx, n.url())
			if err != nil {
				why = fmt.Sprintf("%s: %v", n.id, err)
				return false, nil
			}
			if st.GetLeader() == "" || leader != "" && st.GetLeader() != leader {
				why = fmt.Sprintf("%s sees leader %q", n.id, st.GetLeader())
				return false, nil
			}
			leader = st.GetLeader()
			if st.GetNodeId() == leader {
				voters := 0
				for _, m := range st.GetMembers() {
					if m.GetVoter() {
						voters++
					}
				}
				if voters != len(c.nodes) {
					why = fmt.Sprintf("%d voters of %d", voters, len(c.nodes))
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("cluster not stable: %s: %w", why, err)
	}
	return nil
}

// up starts every node: the first bootstraps, the others join it.
func (c *cluster) up(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := c.start(ctx, n); err != nil {
			return err
		}
	}
	return c.waitStable(ctx, 60*time.Second)
}

// endpoints lists every node's API URL.
func (c *cluster) endpoints() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.url())
	}
	return out
}

// down kills every node and closes the proxies.
func (c *cluster) down() {
	for _, n := range c.nodes {
		n.kill()
		n.raftProxy.close()
		n.apiProxy.close()
	}
}
