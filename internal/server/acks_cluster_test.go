package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

var errGateCut = errors.New("replyGate: link cut")

// replyGate wraps a node's in-memory Raft transport to make the replies to
// its AppendEntries requests (heartbeats, appends, pipelined appends)
// arrive late, and to cut its outgoing requests. It stands for faults a
// real part cannot produce on demand: a return path that delivers the
// followers' answers, in order, long after they were given, while the
// node's own requests stop arriving (a one-way partition).
//
// While holding, every successful reply is queued after the follower gave
// it and reaches Raft only when deliver releases it (oldest first). Once
// armed, the node's TimeoutNow (a leadership transfer) cuts the link
// before it is sent: every later request fails, or is lost if pipelined.
type replyGate struct {
	*raft.InmemTransport

	send          sync.RWMutex // read-held while a request is handed to a follower
	cut           bool         // under send
	cutOnTransfer bool         // under send

	mu      sync.Mutex
	holding bool
	queue   []chan struct{} // held replies, oldest first: closed to deliver
	held    map[raft.ServerAddress]int
	changed chan struct{} // closed and replaced when held grows
}

func newReplyGate(tr *raft.InmemTransport) *replyGate {
	return &replyGate{InmemTransport: tr, held: map[raft.ServerAddress]int{}, changed: make(chan struct{})}
}

// enqueue returns the channel a reply from target waits on before it
// reaches Raft, or nil when the gate is not holding.
func (g *replyGate) enqueue(target raft.ServerAddress) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.holding {
		return nil
	}
	ch := make(chan struct{})
	g.queue = append(g.queue, ch)
	g.held[target]++
	close(g.changed)
	g.changed = make(chan struct{})
	return ch
}

func (g *replyGate) isHolding() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holding
}

func (g *replyGate) hold() {
	g.mu.Lock()
	g.holding = true
	g.mu.Unlock()
}

// deliver lets the oldest held reply reach Raft; it reports how many are
// still held.
func (g *replyGate) deliver() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) > 0 {
		close(g.queue[0])
		g.queue = g.queue[1:]
	}
	return len(g.queue)
}

// open ends every fault: held replies are delivered, requests flow.
func (g *replyGate) open() {
	g.send.Lock()
	g.cut, g.cutOnTransfer = false, false
	g.send.Unlock()
	g.mu.Lock()
	g.holding = false
	for _, ch := range g.queue {
		close(ch)
	}
	g.queue = nil
	g.mu.Unlock()
}

// waitHeld waits until at least n replies of each target were held.
func (g *replyGate) waitHeld(timeout time.Duration, n int, targets ...raft.ServerAddress) error {
	deadline := time.After(timeout)
	for {
		g.mu.Lock()
		ok := true
		for _, tg := range targets {
			ok = ok && g.held[tg] >= n
		}
		changed := g.changed
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-deadline:
			return errors.New("replies were not held in time")
		}
	}
}

func (g *replyGate) isCut() bool {
	g.send.RLock()
	defer g.send.RUnlock()
	return g.cut
}

func (g *replyGate) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	g.send.RLock()
	if g.cut {
		g.send.RUnlock()
		return errGateCut
	}
	err := g.InmemTransport.AppendEntries(id, target, args, resp)
	g.send.RUnlock()
	if err != nil {
		return err
	}
	if ch := g.enqueue(target); ch != nil {
		<-ch
	}
	return nil
}

func (g *replyGate) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if g.isCut() {
		return errGateCut
	}
	return g.InmemTransport.RequestVote(id, target, args, resp)
}

func (g *replyGate) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if g.isCut() {
		return errGateCut
	}
	return g.InmemTransport.RequestPreVote(id, target, args, resp)
}

func (g *replyGate) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if g.isCut() {
		return errGateCut
	}
	return g.InmemTransport.InstallSnapshot(id, target, args, resp, data)
}

// TimeoutNow cuts the link first when armed: every request sent before it
// is already queued at the followers (the in-memory transport hands a
// request over before the call returns, and a follower serves its requests
// in order), so every held reply was given in the old term.
func (g *replyGate) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	g.send.Lock()
	if g.cut {
		g.send.Unlock()
		return errGateCut
	}
	g.cut = g.cutOnTransfer
	g.send.Unlock()
	return g.InmemTransport.TimeoutNow(id, target, args, resp)
}

func (g *replyGate) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := g.InmemTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	gp := &gatedPipeline{g: g, inner: p, target: target, pending: make(chan pendingReply, 4096), out: make(chan raft.AppendFuture), done: make(chan struct{})}
	go gp.collect()
	go gp.forward()
	return gp, nil
}

// gatedPipeline is a pipeline through a replyGate: collect takes every
// answered request from the in-memory pipeline at once (so the follower
// keeps receiving requests), forward hands them to Raft in order, each
// once the gate releases it.
type gatedPipeline struct {
	g       *replyGate
	inner   raft.AppendPipeline
	target  raft.ServerAddress
	pending chan pendingReply
	out     chan raft.AppendFuture
	done    chan struct{}
	once    sync.Once
}

type pendingReply struct {
	f       raft.AppendFuture
	release chan struct{} // nil: deliver at once
}

func (p *gatedPipeline) collect() {
	for {
		select {
		case f := <-p.inner.Consumer():
			r := pendingReply{f: f}
			if f.Error() != nil {
				if p.g.isHolding() {
					continue // lost on the slow link
				}
			} else {
				r.release = p.g.enqueue(p.target)
			}
			select {
			case p.pending <- r:
			case <-p.done:
				return
			}
		case <-p.done:
			return
		}
	}
}

func (p *gatedPipeline) forward() {
	for {
		select {
		case r := <-p.pending:
			if r.release != nil {
				select {
				case <-r.release:
				case <-p.done:
					return
				}
			}
			select {
			case p.out <- r.f:
			case <-p.done:
				return
			}
		case <-p.done:
			return
		}
	}
}

func (p *gatedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.g.send.RLock()
	defer p.g.send.RUnlock()
	if p.g.cut {
		return lostFuture{start: time.Now(), args: args, resp: resp}, nil // never answered
	}
	return p.inner.AppendEntries(args, resp)
}

func (p *gatedPipeline) Consumer() <-chan raft.AppendFuture { return p.out }

func (p *gatedPipeline) Close() error {
	p.once.Do(func() { close(p.done) })
	return p.inner.Close()
}

// lostFuture is a pipelined request the cut link swallowed: Raft never
// sees it answered.
type lostFuture struct {
	start time.Time
	args  *raft.AppendEntriesRequest
	resp  *raft.AppendEntriesResponse
}

func (f lostFuture) Error() error                          { return errGateCut }
func (f lostFuture) Start() time.Time                      { return f.start }
func (f lostFuture) Request() *raft.AppendEntriesRequest   { return f.args }
func (f lostFuture) Response() *raft.AppendEntriesResponse { return f.resp }

// TestDeposedLeaderIgnoresLateReplies: the leader's followers answer its
// heartbeats, their answers are held on the way back (replyGate), the
// leader hands leadership to a follower and its link is cut; the followers
// elect the new leader, which grants a lock. The old leader still leads its
// term in its own eyes (the late replies, delivered one by one, keep its
// Raft lease), and hashicorp/raft's VerifyLeader counts a late reply to a
// heartbeat sent before the check began. The old leader must neither
// confirm a KeepAlive nor serve a linearizable read on the strength of it:
// without the fresh-quorum rule (acks.go) it confirms the KeepAlive and
// reads the lock as free.
func TestDeposedLeaderIgnoresLateReplies(t *testing.T) {
	var (
		mu    sync.Mutex
		gates = map[string]*replyGate{}
	)
	opts := defaultClusterOpts()
	// A one-second Raft lease: the old leader keeps it while late replies
	// trickle in (one per 200 ms), with room for a busy machine.
	opts.heartbeat = time.Second
	opts.raftTransport = func(id string, tr *raft.InmemTransport) raft.Transport {
		g := newReplyGate(tr)
		mu.Lock()
		gates[id] = g
		mu.Unlock()
		return g
	}
	c := newTestCluster(t, 3, opts)
	li, err := c.waitLeader(15 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old, oldID := c.server(li), c.nodes[li].id
	term := old.raft.CurrentTerm()
	mu.Lock()
	g := gates[oldID]
	mu.Unlock()
	next, other := (li+1)%3, (li+2)%3
	nextAddr, otherAddr := raft.ServerAddress(c.nodes[next].id), raft.ServerAddress(c.nodes[other].id)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := func(i int) lockdv1connect.LockServiceClient {
		return lockdv1connect.NewLockServiceClient(http.DefaultClient, c.nodes[i].url)
	}
	sess, err := api(li).CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute), Owner: "old"}))
	if err != nil {
		t.Fatal(err)
	}

	// From here the followers' answers reach the old leader late.
	g.hold()
	var wg sync.WaitGroup
	stopPacer := make(chan struct{})
	wg.Go(func() {
		// The slow return path: one held reply reaches Raft every 200 ms.
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				g.deliver()
			case <-stopPacer:
				return
			}
		}
	})
	defer func() {
		close(stopPacer)
		g.open()
		c.relink()
		wg.Wait()
	}()
	// Enough answers held to keep the old leader's Raft lease for seconds.
	if err := g.waitHeld(15*time.Second, 12, nextAddr, otherAddr); err != nil {
		t.Fatal(err)
	}
	// Nothing the new leader sends reaches the old one (it would learn of
	// the new term and step down); the old leader's own requests stop when
	// it sends TimeoutNow.
	for _, f := range []int{next, other} {
		c.nodes[f].trans.Disconnect(raft.ServerAddress(oldID))
	}
	g.send.Lock()
	g.cutOnTransfer = true
	g.send.Unlock()
	wg.Go(func() { old.raft.LeadershipTransferToServer(raft.ServerID(c.nodes[next].id), nextAddr).Error() })

	// The followers elect the new leader, which grants a lock.
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := c.server(next)
		if s.Ready() && s.raft.State() == raft.Leader && s.raft.CurrentTerm() > term {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become the established leader after the transfer", c.nodes[next].id)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !g.isCut() {
		t.Fatal("the old leader's link was not cut at its TimeoutNow")
	}
	y, err := api(next).CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute), Owner: "new"}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := api(next).Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: y.Msg.SessionId, Secret: y.Msg.Secret, Seq: 1, Name: "fresh/lock"}))
	if err != nil || a.Msg.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED {
		t.Fatalf("acquire on the new leader: %v", err)
	}

	// The old leader still leads its term in its own eyes.
	if old.raft.State() != raft.Leader || old.raft.CurrentTerm() != term {
		t.Fatalf("precondition: the old leader stepped down (%v, term %d, was %d) before the check; late replies did not keep its Raft lease", old.raft.State(), old.raft.CurrentTerm(), term)
	}
	staleBefore := func() uint64 { _, n := old.nd.Hooks().AckCounts(); return n }()
	ka, kaErr := api(li).KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: sess.Msg.SessionId, Secret: sess.Msg.Secret}))
	d, rdErr := api(li).DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "fresh/lock"}))
	if kaErr == nil {
		t.Errorf("the deposed leader confirmed a KeepAlive (ttl %v) after its followers elected %s", ka.Msg.Ttl.AsDuration(), c.nodes[next].id)
	}
	if rdErr == nil {
		t.Errorf("the deposed leader served a linearizable read after the new leader granted the lock: %v", d.Msg.Lock)
	}
	if connect.CodeOf(kaErr) != connect.CodeUnavailable || connect.CodeOf(rdErr) != connect.CodeUnavailable {
		t.Errorf("refusals: keepalive %v, read %v; want UNAVAILABLE (the client retries elsewhere)", kaErr, rdErr)
	}
	if func() uint64 { _, n := old.nd.Hooks().AckCounts(); return n }() == staleBefore {
		t.Errorf("precondition: no check of the old leader had VerifyLeader answered by a late reply (keepalive: %v, read: %v)", kaErr, rdErr)
	}
}

// TestExpiryRetriedAfterStaleCheck: a session's lease runs out on a leader
// whose followers' replies arrive late (replyGate, no partition: the
// followers still follow it). The expiry's leadership check is answered by
// VerifyLeader but no fresh quorum (node.ErrNoFreshQuorum) while the node still
// leads; the decision must be retried, as after a failed proposal, and the
// session expire once replies are timely again — not stay held for the
// rest of the term.
func TestExpiryRetriedAfterStaleCheck(t *testing.T) {
	var (
		mu    sync.Mutex
		gates = map[string]*replyGate{}
	)
	opts := defaultClusterOpts()
	opts.heartbeat = time.Second // the Raft lease the late replies keep
	opts.raftTransport = func(id string, tr *raft.InmemTransport) raft.Transport {
		g := newReplyGate(tr)
		mu.Lock()
		gates[id] = g
		mu.Unlock()
		return g
	}
	c := newTestCluster(t, 3, opts)
	li, err := c.waitLeader(15 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := c.server(li)
	term := s.raft.CurrentTerm()
	mu.Lock()
	g := gates[c.nodes[li].id]
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := lockdv1connect.NewLockServiceClient(http.DefaultClient, c.nodes[li].url)
	sess, err := api.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Second), Owner: "late"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Msg.SessionId

	g.hold()
	var wg sync.WaitGroup
	stopPacer := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond) // the slow return path
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				g.deliver()
			case <-stopPacer:
				return
			}
		}
	})
	defer func() {
		select {
		case <-stopPacer:
		default:
			close(stopPacer)
		}
		g.open()
		wg.Wait()
	}()
	// The lease runs out (TTL + grace); its check finds no fresh quorum.
	deadline := time.Now().Add(15 * time.Second)
	for func() uint64 { _, n := s.nd.Hooks().AckCounts(); return n }() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no leadership check failed for want of fresh replies")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.raft.State() != raft.Leader || s.raft.CurrentTerm() != term {
		t.Fatalf("precondition: the leader stepped down (%v, term %d, was %d)", s.raft.State(), s.raft.CurrentTerm(), term)
	}
	if _, ok := s.fsm.Session(id); !ok {
		t.Fatal("precondition: the session expired before the stale check")
	}
	// Replies are timely again: the retried expiry goes through.
	close(stopPacer)
	g.open()
	deadline = time.Now().Add(15 * time.Second)
	for {
		if _, ok := s.fsm.Session(id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session never expired after its expiry's check failed (leader %v, term %d, was %d)", s.raft.State(), s.raft.CurrentTerm(), term)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s.raft.CurrentTerm() != term {
		t.Logf("a leadership change happened meanwhile (term %d, was %d): the new leader expired the session", s.raft.CurrentTerm(), term)
	}
}
