package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Release-request notices on the session stream. A SubscribeNotices frame
// (the session's secret, checked as KeepAlive's is) registers the stream
// for the session's notices in the node's registry (node.Notices) and is
// answered; then the stream sends a ReleaseRequested frame (call_id 0)
// for each request still pending on the session's holds (fsm ReleaseAsks),
// and again for the session's pending requests each time a request of one
// of its holds is applied on this node. Every node applies every entry, so
// any node serves it (no forwarding). A notice is always read from the
// state, never from the event: the first request's time and reason, and
// the grace with the time of the admin's request that started it. Apply
// only marks the session (noticeSink.Notice: a map write, never a wait);
// the stream's notifier goroutine reads and writes. Memory per stream is
// bounded: the marks by the subscribed sessions, the notices written but
// not yet sent by maxQueuedNotices (each holds a slot until sent, and the
// notifier waits for a slot, so a client that stops reading stalls only
// its own notifier). A notice may repeat; clients key them by (name,
// token).

// maxNoticeSessions bounds the sessions whose notices one stream delivers:
// as many as one keepalive batch renews.
const maxNoticeSessions = maxKeepAliveBatch

// maxQueuedNotices bounds the notices queued on one stream and not yet
// sent.
const maxQueuedNotices = 256

// streamKey is the context key of the streamServer serving a frame.
type streamKey struct{}

// streamOf returns the streamServer whose frame ctx serves, or nil.
func streamOf(ctx context.Context) *streamServer {
	sv, _ := ctx.Value(streamKey{}).(*streamServer)
	return sv
}

// noticeSink is one stream's part in the registry: the sessions it
// delivers, those whose pending requests are to be read, and the notifier
// goroutine that reads and writes them.
type noticeSink struct {
	sv  *streamServer
	reg *node.Notices

	mu       sync.Mutex
	sessions map[string]bool // subscribed sessions; true once answered (started)
	reread   map[string]bool // sessions whose pending requests are to be (re)read
	wake     chan struct{}   // buffered 1
	done     chan struct{}   // closed when the notifier ends; nil if none ran
	slots    chan struct{}   // one per notice queued and not sent yet
}

// Notice implements node.NoticeSink; Apply calls it.
func (ns *noticeSink) Notice(e *fsm.Event) {
	ns.mu.Lock()
	_, ok := ns.sessions[e.Session]
	if ok {
		ns.reread[e.Session] = true
	}
	ns.mu.Unlock()
	if ok {
		ns.signal()
	}
}

func (ns *noticeSink) signal() {
	select {
	case ns.wake <- struct{}{}:
	default:
	}
}

// subscribeNotices serves a SubscribeNotices frame: the stream delivers
// the session's notices from now on (started once the answer is queued).
func subscribeNotices(ctx context.Context, h *sessionAPI, msg proto.Message, _ time.Time) (proto.Message, error) {
	s := h.a.s
	m := msg.(*lockdv1.SubscribeNoticesRequest)
	sv := streamOf(ctx)
	if sv == nil {
		return nil, s.errs.Invalid("SubscribeNotices is served on a session stream only")
	}
	id := m.GetSessionId()
	if id == "" {
		return nil, s.errs.Invalid("session_id is required")
	}
	// One read of the session's secret and owner: a session this node
	// applies between two reads must not pass unchecked.
	hash, owner, ok := s.fsm.SessionAuth(id)
	if !ok {
		return nil, s.errs.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND,
			"session not found on this node (expired, closed, or not applied here yet)")
	}
	if err := s.checkSessionAuth(ctx, id, m.GetSecret(), hash, owner); err != nil {
		return nil, err
	}
	ns := &sv.notices
	ns.mu.Lock()
	_, again := ns.sessions[id]
	if !again && len(ns.sessions) >= maxNoticeSessions {
		ns.mu.Unlock()
		ns.prune(s)
		ns.mu.Lock()
		_, again = ns.sessions[id]
	}
	if !again {
		if len(ns.sessions) >= maxNoticeSessions {
			ns.mu.Unlock()
			return nil, s.errs.APIError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_TOO_MANY,
				fmt.Sprintf("a session stream delivers the notices of at most %d sessions; open another stream", maxNoticeSessions))
		}
		if ns.sessions == nil {
			ns.sv, ns.reg = sv, s.notices
			ns.sessions, ns.reread = map[string]bool{}, map[string]bool{}
			ns.wake, ns.done, ns.slots = make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, maxQueuedNotices)
			go ns.run()
		}
		ns.sessions[id] = false
	}
	ns.mu.Unlock()
	// Registered before the pending requests are read (after the answer):
	// a request applied in between is read or queued, or both (a repeat).
	// Not under ns.mu: Apply takes the registry's lock, then ns.mu.
	if !again {
		s.notices.Subscribe(id, ns)
	}
	return &lockdv1.SubscribeNoticesResponse{}, nil
}

// prune ends the subscriptions of sessions that ended (a long-lived
// stream outlives many). Not under ns.mu: the FSM's lock comes first (Apply
// holds it when it takes ns.mu).
func (ns *noticeSink) prune(s *Server) {
	ns.mu.Lock()
	ids := make([]string, 0, len(ns.sessions))
	for id := range ns.sessions {
		ids = append(ids, id)
	}
	ns.mu.Unlock()
	for _, id := range ids {
		if _, _, ok := s.fsm.SessionAuth(id); ok {
			continue
		}
		ns.reg.Unsubscribe(id, ns)
		ns.mu.Lock()
		delete(ns.sessions, id)
		delete(ns.reread, id)
		ns.mu.Unlock()
	}
}

// started says the answer of a subscription of session id is queued: its
// pending requests are read and written after it.
func (ns *noticeSink) started(id string) {
	ns.mu.Lock()
	_, ok := ns.sessions[id]
	if ok {
		ns.sessions[id] = true
		ns.reread[id] = true
	}
	ns.mu.Unlock()
	if ok {
		ns.signal()
	}
}

// run writes the queued notices and the pending requests of the sessions
// to (re)read until the stream ends.
func (ns *noticeSink) run() {
	defer close(ns.done)
	s := ns.sv.h.a.s
	for {
		select {
		case <-ns.wake:
		case <-ns.sv.ctx.Done():
			return
		case <-ns.sv.quit:
			return
		}
		// Only answered subscriptions: a session not answered yet keeps
		// its mark, read once the answer is queued (started).
		var ids []string
		ns.mu.Lock()
		for id := range ns.reread {
			if ns.sessions[id] {
				ids = append(ids, id)
				delete(ns.reread, id)
			}
		}
		ns.mu.Unlock()
		for _, id := range ids {
			for _, a := range s.fsm.ReleaseAsks(id) {
				n := &lockdv1.ReleaseRequested{SessionId: id, Name: a.Name, Token: a.Token, Reason: a.Reason, RequestedAt: timestamppb.New(a.At)}
				if a.Grace > 0 {
					n.RevokeGrace, n.RevokeGraceFrom = durationpb.New(a.Grace), timestamppb.New(a.GraceFrom)
				}
				select { // wait while maxQueuedNotices are unsent
				case ns.slots <- struct{}{}:
				case <-ns.sv.ctx.Done():
					return
				case <-ns.sv.quit:
					return
				}
				s.metrics.noticesSent.Inc()
				ns.sv.answer(&lockdv1.StreamResponse{ClusterId: ns.sv.h.a.clusterID(),
					Body: &lockdv1.StreamResponse_ReleaseRequested{ReleaseRequested: n}}, ns.slots)
			}
		}
	}
}

// stop ends the stream's subscriptions and waits for its notifier (the
// stream is ending: quit is closed).
func (ns *noticeSink) stop() {
	ns.mu.Lock()
	ids := make([]string, 0, len(ns.sessions))
	for id := range ns.sessions {
		ids = append(ids, id)
	}
	done := ns.done
	ns.mu.Unlock()
	for _, id := range ids {
		ns.reg.Unsubscribe(id, ns)
	}
	if done != nil {
		<-done
	}
}
