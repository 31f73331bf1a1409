package node

import (
	"sync"

	"github.com/lockd-dev/lockd/internal/fsm"
)

// NoticeSink receives the release requests of the sessions it subscribed
// to. Notice is called from Apply (under the FSM's lock): it must not
// block, and must not call back into Notices or the FSM.
type NoticeSink interface {
	Notice(e *fsm.Event)
}

// Notices is the registry of the session streams that deliver release
// requests (SubscribeNotices), by session: the Fanout hands each applied
// EventReleaseAsked to the sinks of its session, found in O(1). Every node
// applies every entry, so any node serves a session's notices.
type Notices struct {
	mu   sync.Mutex
	subs map[string][]NoticeSink
}

// NewNotices returns an empty registry.
func NewNotices() *Notices { return &Notices{subs: map[string][]NoticeSink{}} }

// Subscribe adds sink for session's notices (once: subscribing again
// changes nothing).
func (n *Notices) Subscribe(session string, sink NoticeSink) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.subs[session] {
		if s == sink {
			return
		}
	}
	n.subs[session] = append(n.subs[session], sink)
}

// Unsubscribe removes sink from session's notices.
func (n *Notices) Unsubscribe(session string, sink NoticeSink) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ss := n.subs[session]
	for i, s := range ss {
		if s == sink {
			ss = append(ss[:i:i], ss[i+1:]...)
			break
		}
	}
	if len(ss) == 0 {
		delete(n.subs, session)
	} else {
		n.subs[session] = ss
	}
}

// Events hands each release request among evs to its session's sinks.
func (n *Notices) Events(evs []fsm.Event) {
	locked := false
	for i := range evs {
		e := &evs[i]
		if e.Kind != fsm.EventReleaseAsked {
			continue
		}
		if !locked {
			n.mu.Lock()
			locked = true
		}
		for _, s := range n.subs[e.Session] {
			s.Notice(e)
		}
	}
	if locked {
		n.mu.Unlock()
	}
}
