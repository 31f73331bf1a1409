package lockd

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Release-request notices (RequestRelease): someone asked a holder to let
// go. The client learns of its holds' requests from its session stream:
// once a lock's ReleaseRequested channel is asked for, the client
// subscribes the lock's session on a stream (SubscribeNotices) and again
// on every new stream (a broken stream, a node gone); the server sends the
// requests still pending first, so one made while no stream was open is
// not missed. Without a stream (WithStream(false), or an endpoint that
// cannot carry one) the client watches each such lock's name instead, and
// reads the lock's holders (DescribeLock) when the watch starts or resets.
// Either way a notice is delivered at most once per hold (lock name and
// token), and only while that hold is the lock's current one.

// ReleaseRequest is a request that the holder of a lock let it go.
type ReleaseRequest struct {
	// Name and Token are the lock and the hold asked.
	Name  string
	Token uint64
	// Reason is the asker's reason (may be empty).
	Reason string
	// RequestedAt is when the hold was first asked to let go (for a
	// request a stream delivers as it is applied, or a watch sees, when
	// the client's server applied it).
	RequestedAt time.Time
	// RevokeGrace, when not 0, is how long after RequestedAt the server
	// revokes the holder's session unless the hold ends first (an admin's
	// request on a lock whose policy has a revoke grace).
	RevokeGrace time.Duration
}

// noticeRetry is the wait before a failed subscription is tried again.
const noticeRetry = 500 * time.Millisecond

// unaryNoticesFor is how long the client watches instead when no stream
// could be opened, before it tries a stream again (wire's unaryFor).
const unaryNoticesFor = time.Minute

// noticeTarget is a lock handle that wants notices: a lock (Mutex,
// RWMutex, Semaphore) or a MultiLock.
type noticeTarget interface {
	noticeSession() *Session
	noticeNames() []string
	// notify delivers r if it concerns a current hold of the target.
	notify(r ReleaseRequest)
}

// noticeHub routes a client's notices to its locks and keeps their
// sessions subscribed.
type noticeHub struct {
	c *Client

	mu      sync.Mutex
	locks   map[string][]noticeTarget // by session id: the handles that want notices
	fresh   chan struct{}             // buffered 1: a lock was added
	stop    chan struct{}             // closed by Client.Close
	running bool
}

func (h *noticeHub) init(c *Client) {
	h.c = c
	h.locks = map[string][]noticeTarget{}
	h.fresh = make(chan struct{}, 1)
	h.stop = make(chan struct{})
}

// close stops the hub's loop (Client.Close).
func (h *noticeHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
}

// add makes l's session deliver its notices to l.
func (h *noticeHub) add(l noticeTarget) {
	h.mu.Lock()
	id := l.noticeSession().id
	h.locks[id] = append(h.locks[id], l)
	if !h.running {
		h.running = true
		go h.run()
	}
	h.mu.Unlock()
	select {
	case h.fresh <- struct{}{}:
	default:
	}
}

// deliver hands a notice to the locks it concerns (the streams' reader
// calls it: it never blocks).
func (h *noticeHub) deliver(n *lockdv1.ReleaseRequested) {
	h.mu.Lock()
	ls := h.locks[n.GetSessionId()]
	h.mu.Unlock()
	r := ReleaseRequest{Name: n.GetName(), Token: n.GetToken(), Reason: n.GetReason(), RevokeGrace: n.GetRevokeGrace().AsDuration()}
	if n.GetRequestedAt() != nil {
		r.RequestedAt = n.GetRequestedAt().AsTime()
	}
	for _, l := range ls {
		l.notify(r)
	}
}

// sessions returns the live sessions whose locks want notices, and
// forgets those that ended.
func (h *noticeHub) sessions() []*Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ss []*Session
	for id, ls := range h.locks {
		s := ls[0].noticeSession()
		if s.ctx.Err() != nil {
			delete(h.locks, id)
			continue
		}
		ss = append(ss, s)
	}
	return ss
}

// names returns the names of the live locks that want notices.
func (h *noticeHub) names() map[string]bool {
	names := map[string]bool{}
	for _, s := range h.sessions() {
		h.mu.Lock()
		for _, l := range h.locks[s.id] {
			for _, n := range l.noticeNames() {
				names[n] = true
			}
		}
		h.mu.Unlock()
	}
	return names
}

// run keeps every session that wants notices subscribed on a stream,
// until the client closes; without a stream, it watches instead.
func (h *noticeHub) run() {
	c := h.c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-h.stop
		cancel()
	}()
	var st *wire.Stream
	subscribed := map[*Session]bool{}
	attempt := 0
	for ctx.Err() == nil {
		if !c.cfg.stream {
			h.watchUnary(ctx, nil)
			return
		}
		if st == nil {
			var err error
			st, err = c.call.OpenStream(ctx, c.eps.At(attempt))
			if errors.Is(err, wire.ErrNoStream) {
				c.logger.Info("release-request notices: no session stream; watching the locks instead")
				h.watchUnary(ctx, time.After(unaryNoticesFor))
				continue
			}
			if err != nil {
				attempt++
				h.pause(ctx, nil)
				continue
			}
			clear(subscribed)
		}
		failed := false
		live := h.sessions()
		for s := range subscribed {
			if s.ctx.Err() != nil {
				delete(subscribed, s)
			}
		}
		for _, s := range live {
			if subscribed[s] {
				continue
			}
			sctx, scancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
			err := st.SubscribeNotices(sctx, s.id, s.secret)
			scancel()
			if err != nil {
				if s.ctx.Err() == nil {
					c.logger.Debug("release-request notices: subscribe failed", "session", s.id, "err", err)
				}
				failed = true
				continue
			}
			subscribed[s] = true
		}
		if failed {
			attempt++
		}
		select {
		case <-st.Done():
			st = nil
		default:
			if failed {
				h.pause(ctx, st.Done())
			} else {
				h.pause(ctx, st.Done(), h.fresh)
			}
			select {
			case <-st.Done():
				st = nil
			default:
			}
		}
	}
}

// pause waits noticeRetry (or for one of chs, forever when chs has the
// hub's fresh channel), or ctx.
func (h *noticeHub) pause(ctx context.Context, done <-chan struct{}, fresh ...chan struct{}) {
	var timer <-chan time.Time
	var wake chan struct{}
	if len(fresh) == 0 {
		t := time.NewTimer(noticeRetry)
		defer t.Stop()
		timer = t.C
	} else {
		wake = fresh[0]
	}
	select {
	case <-ctx.Done():
	case <-done:
	case <-timer:
	case <-wake:
	}
}

// watchUnary delivers notices from watches of the locks' names, until ctx
// ends or until (nil: never).
func (h *noticeHub) watchUnary(ctx context.Context, until <-chan time.Time) {
	watching := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range watching {
			stop()
		}
	}()
	for {
		names := h.names()
		for name, stop := range watching {
			if !names[name] {
				stop()
				delete(watching, name)
			}
		}
		for name := range names {
			if watching[name] == nil {
				wctx, stop := context.WithCancel(ctx)
				watching[name] = stop
				go h.watchName(wctx, name)
			}
		}
		t := time.NewTimer(time.Second) // sessions that ended
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-until:
			t.Stop()
			return
		case <-h.fresh:
		case <-t.C:
		}
		t.Stop()
	}
}

// watchName delivers the requests of one lock name: its holders' pending
// ones when the watch starts or resets, then each one the watch shows.
func (h *noticeHub) watchName(ctx context.Context, name string) {
	for ctx.Err() == nil {
		// Watch reconnects by itself; it ends only for good reasons
		// (credentials, the client closed), retried here after a pause.
		for ev, err := range h.c.Watch(ctx, name, WatchState()) {
			if err != nil && !errors.Is(err, ErrWatchReset) {
				h.c.logger.Debug("release-request notices: watch ended", "lock", name, "err", err)
				break
			}
			switch {
			case ev.Kind == EventSynced:
				h.pending(ctx, name)
			case ev.Kind == EventReleaseRequested && ev.Name == name:
				// The holder's record has the first request's time and
				// the revoke grace; the event, only the reason.
				if !h.pending(ctx, name) {
					h.deliver(&lockdv1.ReleaseRequested{SessionId: ev.Session, Name: name, Token: ev.Token, Reason: string(ev.Value),
						RequestedAt: timestamppb.Now()})
				}
			}
		}
		h.pause(ctx, nil)
	}
}

// pending delivers the pending requests of name's holders (DescribeLock);
// false when the lock could not be read.
func (h *noticeHub) pending(ctx context.Context, name string) bool {
	resp, err := h.c.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		return false
	}
	for _, hd := range resp.Msg.GetLock().GetHolders() {
		if hd.GetReleaseRequestedAt() != nil {
			h.deliver(&lockdv1.ReleaseRequested{SessionId: hd.GetSessionId(), Name: name, Token: hd.GetToken(),
				Reason: hd.GetReleaseReason(), RequestedAt: hd.GetReleaseRequestedAt(), RevokeGrace: hd.GetRevokeGrace()})
		}
	}
	return true
}

// releaseRequested returns l's notice channel, subscribing its session
// on first use.
func (l *lock) releaseRequested() <-chan ReleaseRequest {
	l.mu.Lock()
	ch, first := l.notes, l.notes == nil
	if first {
		ch = make(chan ReleaseRequest, 1)
		l.notes = ch
	}
	l.mu.Unlock()
	if first {
		l.s.c.notices.add(l)
	}
	return ch
}

// notify delivers r to l's channel when it concerns l's current hold and
// was not delivered for it yet; a notice for a grant not installed yet is
// kept until it is.
func (l *lock) notify(r ReleaseRequest) {
	if r.Name != l.name {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		if l.busy && r.Token > l.noted {
			l.early = &r
		}
		return
	}
	if l.h.token != r.Token || l.noted == r.Token {
		return
	}
	l.noted = r.Token
	sendLatest(l.notes, r)
}

// sendLatest puts r in ch (buffered 1), replacing an unread one.
func sendLatest(ch chan ReleaseRequest, r ReleaseRequest) {
	select {
	case <-ch: // an older hold's, unread
	default:
	}
	ch <- r
}

func (l *lock) noticeSession() *Session { return l.s }
func (l *lock) noticeNames() []string   { return []string{l.name} }

// ReleaseRequested returns a channel that receives a ReleaseRequest when
// someone asks one lock of the held set to let go (its Name and Token say
// which), once per lock and hold, as Mutex.ReleaseRequested.
func (m *MultiLock) ReleaseRequested() <-chan ReleaseRequest {
	m.mu.Lock()
	ch, first := m.notes, m.notes == nil
	if first {
		ch = make(chan ReleaseRequest, 1)
		m.notes, m.noted = ch, map[string]uint64{}
	}
	m.mu.Unlock()
	if first {
		m.s.c.notices.add(m)
	}
	return ch
}

func (m *MultiLock) noticeSession() *Session { return m.s }
func (m *MultiLock) noticeNames() []string   { return m.names }

func (m *MultiLock) notify(r ReleaseRequest) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil || m.h.tokens[r.Name] != r.Token || m.noted[r.Name] == r.Token {
		return
	}
	m.noted[r.Name] = r.Token
	sendLatest(m.notes, r)
}

// noticeGranted is granted's part: a stale notice leaves the channel and
// one that came before the grant was installed is delivered. l.mu is held.
func (l *lock) noticeGranted() {
	if l.notes == nil {
		return
	}
	select {
	case <-l.notes:
	default:
	}
	if e := l.early; e != nil && e.Token == l.h.token && l.noted != e.Token {
		l.noted = e.Token
		l.notes <- *e
	}
	l.early = nil
}
