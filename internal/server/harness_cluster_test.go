package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// This file is a harness for in-process lockd clusters with faults: 3 or 5
// real nodes (real data dirs, real API listeners on 127.0.0.1) on
// hashicorp/raft's in-memory transport, and a "chaos network" that decides
// which links are up:
//
//   - Raft traffic: the in-memory transports are connected or disconnected
//     pairwise (InmemTransport.Connect/Disconnect).
//   - Forwarding between nodes and client traffic to nodes: every HTTP client
//     (a node's forward client, each test client) goes through a
//     chaosTransport that refuses requests across a cut link and resets
//     in-flight requests on a link that is cut, as a real partition or crash
//     would (ECONNRESET), so the outcome of such a request is unknown to the
//     caller.
//
// Nodes can be stopped (Close) and restarted on the same data dir, API port
// and Raft address. A "crash" cuts every link of the node before closing it,
// so nothing (no leadership transfer, no in-flight answer) leaves it.

var (
	errChaosRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	errChaosReset   = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
)

// chaosNet is the state of the links between nodes and from clients to
// nodes.
type chaosNet struct {
	streams  atomic.Int64 // session streams the clients opened
	mu       sync.Mutex
	group    map[string]int             // node id -> partition group
	down     map[string]bool            // stopped or crashed nodes
	clients  map[string]map[string]bool // client name -> nodes it reaches (nil: all)
	hosts    map[string]string          // API host:port -> node id
	inflight map[*chaosFlight]struct{}
}

// chaosFlight is one HTTP request in flight on a link.
type chaosFlight struct {
	from, to string
	cut      chan struct{} // closed when the link is cut under it
	cancel   context.CancelFunc
}

func newChaosNet() *chaosNet {
	return &chaosNet{
		group:    map[string]int{},
		down:     map[string]bool{},
		clients:  map[string]map[string]bool{},
		hosts:    map[string]string{},
		inflight: map[*chaosFlight]struct{}{},
	}
}

func (n *chaosNet) linkedLocked(from, to string) bool {
	if n.down[to] || n.down[from] {
		return false
	}
	if allowed, isClient := n.clients[from]; isClient {
		return allowed == nil || allowed[to]
	}
	return n.group[from] == n.group[to]
}

// nodesLinked reports whether two nodes can talk (Raft and forwarding).
func (n *chaosNet) nodesLinked(a, b string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkedLocked(a, b)
}

// change runs f under the lock, then resets every in-flight request whose
// link is now cut.
func (n *chaosNet) change(f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f()
	for fl := range n.inflight {
		if !n.linkedLocked(fl.from, fl.to) {
			delete(n.inflight, fl)
			close(fl.cut)
			fl.cancel()
		}
	}
}

func (n *chaosNet) open(from, to string, cancel context.CancelFunc) (*chaosFlight, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.linkedLocked(from, to) {
		return nil, false
	}
	fl := &chaosFlight{from: from, to: to, cut: make(chan struct{}), cancel: cancel}
	n.inflight[fl] = struct{}{}
	return fl, true
}

func (n *chaosNet) done(fl *chaosFlight) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.inflight, fl)
}

func (n *chaosNet) nodeOf(host string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id, ok := n.hosts[host]
	return id, ok
}

// chaosTransport is an http.RoundTripper from one node or client ("from")
// through the chaos network.
type chaosTransport struct {
	net  *chaosNet
	from string
	base *http.Transport
}

func (t *chaosTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	to, ok := t.net.nodeOf(req.URL.Host)
	if !ok {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errChaosRefused
	}
	ctx, cancel := context.WithCancel(req.Context())
	fl, ok := t.net.open(t.from, to, cancel)
	if !ok {
		cancel()
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errChaosRefused
	}
	type result struct {
		resp *http.Response
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		resp, err := t.base.RoundTrip(req.WithContext(ctx))
		ch <- result{resp, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.net.done(fl)
			cancel()
			select {
			case <-fl.cut:
				return nil, errChaosReset
			default:
				return nil, r.err
			}
		}
		r.resp.Body = &chaosBody{rc: r.resp.Body, fl: fl, net: t.net, cancel: cancel}
		if req.URL.Path == "/"+lockdv1connect.SessionServiceName+"/Stream" && r.resp.StatusCode == http.StatusOK {
			t.net.streams.Add(1)
		}
		return r.resp, nil
	case <-fl.cut:
		go func() {
			if r := <-ch; r.resp != nil {
				r.resp.Body.Close()
			}
		}()
		return nil, errChaosReset
	}
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the base
// transport.
func (t *chaosTransport) CloseIdleConnections() { t.base.CloseIdleConnections() }

type chaosBody struct {
	rc     io.ReadCloser
	fl     *chaosFlight
	net    *chaosNet
	cancel context.CancelFunc
	once   sync.Once
}

func (b *chaosBody) Read(p []byte) (int, error) {
	select {
	case <-b.fl.cut:
		return 0, errChaosReset
	default:
	}
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		select {
		case <-b.fl.cut:
			return n, errChaosReset
		default:
		}
	}
	return n, err
}

func (b *chaosBody) Close() error {
	err := b.rc.Close()
	b.once.Do(func() {
		b.net.done(b.fl)
		b.cancel()
	})
	return err
}

// clusterOpts are the knobs of a test cluster.
type clusterOpts struct {
	heartbeat time.Duration // Raft heartbeat and election timeout
	grace     time.Duration // lease grace on the leader
	request   time.Duration // client per-attempt timeout
	history   int           // Config.WatchHistory; 0: the default
	trailing  uint64        // Config.TrailingLogs (and 4 KiB WAL segments, so truncation drops entries); 0: the defaults
	security  Security      // auth file, peer token, limits
	// raftTransport, if set, wraps each node's in-memory transport (fault
	// injection); the harness still connects the in-memory transports.
	raftTransport func(id string, tr *raft.InmemTransport) raft.Transport
	// nodeOptions, if set, are more options of node id's server.
	nodeOptions func(id string) []Option
}

func defaultClusterOpts() clusterOpts {
	return clusterOpts{heartbeat: 100 * time.Millisecond, grace: 100 * time.Millisecond, request: time.Second}
}

// tnode is one member of a test cluster.
type tnode struct {
	idx    int
	id     string // node id and Raft address
	dir    string
	listen string // API address, fixed after the first start
	url    string
	hc     *http.Client // forward client, through the chaos network
	trans  *raft.InmemTransport
	srv    *Server // nil while down
}

// tcluster is an in-process cluster with a chaos network.
type tcluster struct {
	t    testing.TB
	opts clusterOpts
	net  *chaosNet
	boot []raft.Server

	mu      sync.Mutex // guards nodes' srv and trans, clients, bases
	nodes   []*tnode
	clients []*lockd.Client
	bases   []*http.Transport
	fatals  []error
}

func newTestCluster(t testing.TB, n int, opts clusterOpts) *tcluster {
	t.Helper()
	c := &tcluster{t: t, opts: opts, net: newChaosNet()}
	for i := range n {
		nd := &tnode{idx: i, id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(), listen: "127.0.0.1:0"}
		nd.hc = &http.Client{Transport: &chaosTransport{net: c.net, from: nd.id, base: c.newBase(false)}}
		c.nodes = append(c.nodes, nd)
		c.boot = append(c.boot, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(nd.id), Address: raft.ServerAddress(nd.id)})
	}
	t.Cleanup(c.close)
	for i := range n {
		if err := c.start(i); err != nil {
			t.Fatalf("start %s: %v", c.nodes[i].id, err)
		}
	}
	if _, err := c.waitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *tcluster) newBase(h2c bool) *http.Transport {
	b := &http.Transport{
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
	}
	if h2c {
		b.Protocols = new(http.Protocols)
		b.Protocols.SetUnencryptedHTTP2(true)
	}
	c.mu.Lock()
	c.bases = append(c.bases, b)
	c.mu.Unlock()
	return b
}

func (c *tcluster) config(nd *tnode) Config {
	cfg := DefaultConfig()
	cfg.DataDir = nd.dir
	cfg.Listen = nd.listen
	cfg.RaftListen = "127.0.0.1:0" // unused: in-memory transport
	cfg.NodeID = nd.id
	cfg.HeartbeatTimeout = c.opts.heartbeat
	cfg.ElectionTimeout = c.opts.heartbeat
	cfg.Grace = c.opts.grace
	cfg.MinTTL = 100 * time.Millisecond
	cfg.ApplyTimeout = 2 * time.Second
	cfg.MaxPollTimeout = 5 * time.Second
	// Keep the whole log, so the test can replay it.
	cfg.SnapshotThreshold = 1 << 30
	cfg.SnapshotLogBytes = 0
	cfg.SnapshotInterval = time.Hour
	cfg.WatchHistory = c.opts.history
	if c.opts.trailing > 0 {
		cfg.TrailingLogs = c.opts.trailing
		cfg.WALSegmentSize = 4096
	}
	cfg.Security = c.opts.security
	return cfg
}

func testLogger(id string) *slog.Logger {
	if os.Getenv("LOCKD_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", id)
}

// start starts node i on its data dir (again), on the same API address and
// Raft address as before.
func (c *tcluster) start(i int) error {
	nd := c.nodes[i]
	_, tr := raft.NewInmemTransportWithTimeout(raft.ServerAddress(nd.id), 100*time.Millisecond)
	var rt raft.Transport = tr
	if c.opts.raftTransport != nil {
		rt = c.opts.raftTransport(nd.id, tr)
	}
	var (
		s   *Server
		err error
	)
	for attempt := 0; attempt < 40; attempt++ {
		opts := []Option{WithRaftTransport(rt), WithForwardClient(nd.hc), WithBootstrapServers(c.boot),
			WithLogger(testLogger(nd.id)),
			WithFatal(func(err error) {
				c.mu.Lock()
				c.fatals = append(c.fatals, fmt.Errorf("node %s: %w", nd.id, err))
				c.mu.Unlock()
			})}
		if c.opts.nodeOptions != nil {
			opts = append(opts, c.opts.nodeOptions(nd.id)...)
		}
		s, err = newRecovered(c.config(nd), opts...)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the old listener's port is not free yet
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	nd.srv, nd.trans = s, tr
	nd.listen = s.Addr().String()
	nd.url = s.URL()
	c.mu.Unlock()
	c.net.change(func() {
		c.net.hosts[nd.listen] = nd.id
		delete(c.net.down, nd.id)
	})
	c.relink()
	return nil
}

// newRecovered is New, with a panic (hashicorp/raft panics when its log
// store cannot read an entry at start-up) turned into an error, so that it
// fails the test instead of the whole test binary. raft-wal v0.4.0 panics
// that way after a tail truncation (hashicorp/raft-wal#31, fixed in v0.4.1).
func newRecovered(cfg Config, opts ...Option) (s *Server, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("server.New panicked on restart: %v (hashicorp/raft-wal v0.4.0 panics like this after a log tail truncation, hashicorp/raft-wal#31, fixed in v0.4.1)", r)
		}
	}()
	return New(cfg, opts...)
}

// relink connects or disconnects every pair of in-memory transports as the
// chaos network says.
func (c *tcluster) relink() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.nodes {
		if a.trans == nil {
			continue
		}
		for _, b := range c.nodes {
			if a == b {
				continue
			}
			if a.srv != nil && b.srv != nil && b.trans != nil && c.net.nodesLinked(a.id, b.id) {
				a.trans.Connect(raft.ServerAddress(b.id), b.trans)
			} else {
				a.trans.Disconnect(raft.ServerAddress(b.id))
			}
		}
	}
}

// stop stops node i. With crash, every link of the node is cut first, so
// it neither hands over leadership nor answers anything in flight.
func (c *tcluster) stop(i int, crash bool) {
	c.mu.Lock()
	nd := c.nodes[i]
	s := nd.srv
	if s == nil {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if crash {
		c.net.change(func() { c.net.down[nd.id] = true })
		c.mu.Lock()
		nd.srv = nil
		c.mu.Unlock()
		c.relink()
	}
	if err := s.Close(); err != nil {
		c.t.Logf("close %s: %v", nd.id, err)
	}
	c.mu.Lock()
	nd.srv = nil
	c.mu.Unlock()
	c.net.change(func() { c.net.down[nd.id] = true })
	c.relink()
}

func (c *tcluster) isUp(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv != nil
}

func (c *tcluster) server(i int) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// leaderIndex returns the node that is the established leader (Barrier done,
// lease timers running) in the highest term, or -1.
func (c *tcluster) leaderIndex() int {
	best, bestTerm := -1, uint64(0)
	for i := range c.nodes {
		s := c.server(i)
		if s == nil || !s.Ready() || s.raft.State() != raft.Leader {
			continue
		}
		if term := s.raft.CurrentTerm(); term > bestTerm {
			best, bestTerm = i, term
		}
	}
	return best
}

// waitLeader waits until exactly one node is an established leader, and no
// node that can reach it believes in another leader.
func (c *tcluster) waitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		leaders := 0
		idx := -1
		for i := range c.nodes {
			s := c.server(i)
			if s != nil && s.Ready() && s.raft.State() == raft.Leader {
				leaders++
				idx = i
			}
		}
		if leaders == 1 {
			return idx, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no single established leader after %v (%d leaders)", timeout, leaders)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// partition splits the nodes into groups (node indexes); nodes not listed
// form one more group.
func (c *tcluster) partition(groups ...[]int) {
	c.net.change(func() {
		for _, nd := range c.nodes {
			c.net.group[nd.id] = len(groups)
		}
		for g, idxs := range groups {
			for _, i := range idxs {
				c.net.group[c.nodes[i].id] = g
			}
		}
	})
	c.relink()
}

// heal joins all nodes in one group and lets every client reach every node.
func (c *tcluster) heal() {
	c.net.change(func() {
		clear(c.net.group)
		for name := range c.net.clients {
			c.net.clients[name] = nil
		}
	})
	c.relink()
}

// restrictClient lets the named client reach only the given nodes (none:
// no node at all); all == nil lifts the restriction.
func (c *tcluster) restrictClient(name string, nodes []int) {
	c.net.change(func() {
		if nodes == nil {
			c.net.clients[name] = nil
			return
		}
		m := map[string]bool{}
		for _, i := range nodes {
			m[c.nodes[i].id] = true
		}
		c.net.clients[name] = m
	})
}

func (c *tcluster) urls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, nd := range c.nodes {
		out = append(out, nd.url)
	}
	return out
}

// streamOn reports whether clients use the session stream (the client's
// default; LOCKD_STREAM=off runs the suite unary only).
func streamOn() bool {
	switch os.Getenv("LOCKD_STREAM") {
	case "off", "0", "false":
		return false
	}
	return true
}

// newClient returns a Go client named name (for restrictClient) that knows
// every node; the cluster closes it at the end of the test.
func (c *tcluster) newClient(name string, opts ...lockd.Option) *lockd.Client {
	c.t.Helper()
	c.net.change(func() {
		if _, ok := c.net.clients[name]; !ok {
			c.net.clients[name] = nil
		}
	})
	// Clients speak h2c like lockd.New's own transport, so their session
	// calls go over the stream (unless LOCKD_STREAM=off).
	hc := &http.Client{Transport: &chaosTransport{net: c.net, from: name, base: c.newBase(streamOn())}}
	all := append([]lockd.Option{
		lockd.WithEndpoints(c.urls()...), lockd.WithHTTPClient(hc), lockd.WithStream(streamOn()),
		lockd.WithRequestTimeout(c.opts.request), lockd.WithRetryTimeout(5 * time.Second),
	}, opts...)
	cl, err := lockd.New(all...)
	if err != nil {
		c.t.Fatalf("new client: %v", err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// healAndRestart heals the network, restarts every stopped node and waits
// for an established leader.
func (c *tcluster) healAndRestart(timeout time.Duration) (int, error) {
	c.heal()
	for i := range c.nodes {
		if !c.isUp(i) {
			if err := c.start(i); err != nil {
				return -1, fmt.Errorf("restart %s: %w", c.nodes[i].id, err)
			}
		}
	}
	return c.waitLeader(timeout)
}

// close stops clients first (so their sessions close while the servers are
// up), then every node, then idle connections.
func (c *tcluster) close() {
	c.heal()
	c.mu.Lock()
	clients := slices.Clone(c.clients)
	c.clients = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Go(func() { cl.Close(context.Background()) })
	}
	wg.Wait()
	for i := range c.nodes {
		wg.Go(func() { c.stop(i, false) })
	}
	wg.Wait()
	c.mu.Lock()
	for _, b := range c.bases {
		b.CloseIdleConnections()
	}
	fatals := c.fatals
	c.mu.Unlock()
	for _, err := range fatals {
		c.t.Errorf("server fatal: %v", err)
	}
}

// converged waits until every running node has applied the leader's last
// index, then reports whether all FSMs hold the same locks and sessions.
func (c *tcluster) converged(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		li := c.leaderIndex()
		if li < 0 {
			last = errors.New("no leader")
			time.Sleep(20 * time.Millisecond)
			continue
		}
		ls := c.server(li)
		if err := ls.raft.Barrier(2 * time.Second).Error(); err != nil {
			last = fmt.Errorf("barrier: %w", err)
			continue
		}
		want := ls.raft.AppliedIndex()
		// Followers learn the commit index only from the next
		// AppendEntries (hashicorp/raft heartbeats do not carry it): a
		// second barrier tells them everything up to want is committed.
		if err := ls.raft.Barrier(2 * time.Second).Error(); err != nil {
			last = fmt.Errorf("barrier: %w", err)
			continue
		}
		wantLocks, _ := ls.fsm.List("", "", 1<<20)
		wantSessions := ls.fsm.Sessions()
		last = nil
		for i := range c.nodes {
			s := c.server(i)
			if s == nil || i == li {
				continue
			}
			if s.raft.AppliedIndex() < want {
				last = fmt.Errorf("%s applied %d < %d", c.nodes[i].id, s.raft.AppliedIndex(), want)
				break
			}
			locks, _ := s.fsm.List("", "", 1<<20)
			if fmt.Sprint(locks) != fmt.Sprint(wantLocks) || fmt.Sprint(s.fsm.Sessions()) != fmt.Sprint(wantSessions) {
				last = fmt.Errorf("%s state differs from leader %s at index %d", c.nodes[i].id, c.nodes[li].id, want)
				break
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return last
}
