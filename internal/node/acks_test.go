package node

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
)

var ackServers = []raft.Server{
	{ID: "a", Suffrage: raft.Voter}, // this node
	{ID: "b", Suffrage: raft.Voter},
	{ID: "c", Suffrage: raft.Voter},
	{ID: "d", Suffrage: raft.Nonvoter},
	{ID: "e", Suffrage: raft.Nonvoter},
}

// TestAckTrackerCountsOnlyFreshVoterAcks: replies to requests sent before
// the check began, replies of an older term and replies of non-voters do
// not make a quorum (hashicorp/raft's VerifyLeader counts all three); a
// fresh reply of one more voter does, and wakes the waiting check.
func TestAckTrackerCountsOnlyFreshVoterAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var acks ackTracker
		never := make(chan struct{})
		stays := func() <-chan struct{} { return never }
		before := time.Now()
		time.Sleep(time.Millisecond) // fake time: the check begins strictly later
		since := time.Now()
		acks.record("b", 5, before) // a heartbeat sent before the check, answered after
		acks.record("c", 4, since)  // an older term
		acks.record("d", 5, since)  // non-voters
		acks.record("e", 5, since)
		start := time.Now()
		err := acks.await("a", ackServers, 5, since, time.Second, never, stays)
		if !errors.Is(err, ErrNoFreshQuorum) || !errors.Is(err, raft.ErrNotLeader) {
			t.Fatalf("stale, old-term and non-voter acks: %v, want ErrNoFreshQuorum", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("waited %v, want the timeout (1s)", waited)
		}
		if acks.stale.Load() != 1 {
			t.Fatalf("stale checks: %d, want 1", acks.stale.Load())
		}

		// A waiting check wakes at the fresh reply, without polling.
		done := make(chan error, 1)
		go func() { done <- acks.await("a", ackServers, 5, since, time.Hour, never, stays) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("check ended before a fresh reply: %v", err)
		default:
		}
		acks.record("c", 5, time.Now())
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("after a fresh reply of a second voter: %v", err)
			}
		default:
			t.Fatal("a fresh reply did not wake the check")
		}
		// An older send time never replaces a newer one.
		acks.record("c", 5, before)
		if err := acks.await("a", ackServers, 5, since, 0, never, stays); err != nil {
			t.Fatalf("an older ack replaced a fresh one: %v", err)
		}
	})
}

// TestAckTrackerEndsWaitOnLeadershipChangeAndClose: a waiting check ends at
// once when leadership changes or the server closes.
func TestAckTrackerEndsWaitOnLeadershipChangeAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var acks ackTracker
		never := make(chan struct{})
		closed := make(chan struct{})
		close(closed)
		since := time.Now()
		if err := acks.await("a", ackServers, 1, since, time.Hour, never, func() <-chan struct{} { return closed }); !errors.Is(err, raft.ErrLeadershipLost) {
			t.Fatalf("leadership changed: %v, want ErrLeadershipLost", err)
		}
		if err := acks.await("a", ackServers, 1, since, time.Hour, closed, func() <-chan struct{} { return never }); !errors.Is(err, raft.ErrRaftShutdown) {
			t.Fatalf("closed: %v, want ErrRaftShutdown", err)
		}
		// A single voter is its own quorum.
		if err := acks.await("a", ackServers[:1], 1, since, 0, never, func() <-chan struct{} { return never }); err != nil {
			t.Fatalf("single voter: %v", err)
		}
	})
}

// TestAckTransportRecordsSendTime: the wrapper records a successful reply
// with the time its request was sent, ignores a refused one, and keeps the
// wrapped transport's optional interfaces (pre-vote only when the wrapped
// transport has it: hashicorp/raft decides by a type assertion).
func TestAckTransportRecordsSendTime(t *testing.T) {
	_, a := raft.NewInmemTransport("a")
	_, b := raft.NewInmemTransport("b")
	a.Connect("b", b)
	done := make(chan struct{})
	defer close(done)
	go func() { // the follower: refuses term 2, accepts term 3
		for {
			select {
			case rpc := <-b.Consumer():
				req := rpc.Command.(*raft.AppendEntriesRequest)
				rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: req.Term == 3}, nil)
			case <-done:
				return
			}
		}
	}()
	var acks ackTracker
	tr := trackAcks(a, &acks)
	for _, ok := range []bool{
		is[raft.WithPreVote](tr), is[raft.WithClose](tr), is[raft.WithPeers](tr),
		!is[raft.WithPreVote](trackAcks(struct{ raft.Transport }{a}, &acks)),
	} {
		if !ok {
			t.Fatal("the wrapper lost or added an optional transport interface")
		}
	}
	var resp raft.AppendEntriesResponse
	if err := tr.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 2}, &resp); err != nil {
		t.Fatal(err)
	}
	if _, ok := acks.peers["b"]; ok {
		t.Fatal("a refused AppendEntries was recorded")
	}
	before := time.Now()
	if err := tr.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 3}, &resp); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	got := acks.peers["b"]
	if got.term != 3 || got.sent.Before(before) || got.sent.After(after) {
		t.Fatalf("recorded %+v, want term 3 sent in [%v, %v]", got, before, after)
	}

	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	wt := trackAcks(nt, &acks)
	if !is[interface{ CloseStreams() }](wt) || !is[raft.WithPreVote](wt) {
		t.Fatal("a wrapped NetworkTransport lost CloseStreams or pre-vote")
	}
	wt.(interface{ CloseStreams() }).CloseStreams()
	if err := wt.(raft.WithClose).Close(); err != nil || !nt.IsShutdown() {
		t.Fatalf("close through the wrapper: %v, shut down %v", err, nt.IsShutdown())
	}
}

func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}

// BenchmarkAckTransportAppendEntries: what the wrapper adds to every
// heartbeat and append sent (a clock read and one uncontended lock; no
// allocation), against the bare call.
func BenchmarkAckTransportAppendEntries(b *testing.B) {
	req := &raft.AppendEntriesRequest{Term: 7}
	var resp raft.AppendEntriesResponse
	for _, bc := range []struct {
		name string
		tr   raft.Transport
	}{{"bare", okTransport{}}, {"wrapped", trackAcks(okTransport{}, &ackTracker{})}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.tr.AppendEntries("n2", "n2", req, &resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// okTransport answers every AppendEntries at once with success: the cost
// measured is the wrapper's alone.
type okTransport struct{ raft.Transport }

func (okTransport) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	resp.Term, resp.Success = args.Term, true
	return nil
}
