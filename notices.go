package lockd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Release-request notices (RequestRelease): someone asked a holder to let
// go. The client learns of its holds' requests from its session stream:
// while a lock whose ReleaseRequested channel was asked for is being
// acquired or is held, the client keeps the lock's session subscribed on a
// stream (SubscribeNotices), again on every new stream (a broken stream, a
// node gone); the server sends the requests still pending first, so one
// made while no stream was open is not missed. Without a stream
// (WithStream(false), an endpoint that cannot carry one, or a server that
// does not know SubscribeNotices) the client watches each such lock's name
// instead (notices_watch.go), and reads the lock's holders (DescribeLock)
// when the watch starts or resets. Either way a notice is delivered at most
// once per hold (lock name and token) and grace state (once without a
// revoke grace, once more when an admin's request starts one), and only
// while that hold is the lock's current one.

// ReleaseRequest is a request that the holder of a lock let it go.
type ReleaseRequest struct {
	// Name and Token are the lock and the hold asked.
	Name  string
	Token uint64
	// Reason is the asker's reason (may be empty).
	Reason string
	// RequestedAt is when the hold was first asked to let go (the
	// asker's server's clock).
	RequestedAt time.Time
	// RevokeGrace, when not 0, is how long after RevokeAt's start the
	// server revokes the holder's session unless the hold ends first (an
	// admin's request on a lock whose policy has a revoke grace), and
	// RevokeAt when: the admin's request's time plus the grace (a server
	// too old to say when the grace started: RequestedAt plus it). The
	// leader counts the grace from when it applied that request and
	// restarts it in full after a leader change, so the revocation comes
	// no earlier, perhaps later.
	RevokeGrace time.Duration
	RevokeAt    time.Time
}

// revokeAt is when a grace given with its start (from, nil when the
// server did not say) and the first request's time ends; zero without a
// grace.
func revokeAt(grace time.Duration, from *timestamppb.Timestamp, requested time.Time) time.Time {
	switch {
	case grace <= 0:
		return time.Time{}
	case from != nil:
		return from.AsTime().Add(grace)
	}
	return requested.Add(grace)
}

// noticeRetry is the first wait before a failed subscription or watch is
// tried again; each further failure in a row doubles it, up to
// noticeRetryMax.
const (
	noticeRetry    = 500 * time.Millisecond
	noticeRetryMax = time.Minute
)

// unaryNoticesFor is how long the client watches instead when no stream
// could be opened, or the server did not know SubscribeNotices, before it
// tries a stream again (wire's unaryFor).
const unaryNoticesFor = time.Minute

// backoff is the wait before the next try after failures in a row.
type backoff struct{ next time.Duration }

// wait returns the wait before the next try, and doubles the one after.
func (b *backoff) wait() time.Duration {
	d := max(b.next, noticeRetry)
	b.next = min(2*d, noticeRetryMax)
	return d
}

// reset starts again from noticeRetry (a try worked).
func (b *backoff) reset() { b.next = 0 }

// noticeTarget is a lock handle that wants notices: a lock (Mutex,
// RWMutex, Semaphore) or a MultiLock.
type noticeTarget interface {
	noticeSession() *Session
	noticeNames() []string
	// notify delivers r if it concerns a current hold of the target.
	notify(r ReleaseRequest)
}

// noticeHub routes a client's notices to its locks and keeps their
// sessions subscribed. It knows a handle only while the handle acquires or
// holds (add, remove), so it tracks current holds only.
type noticeHub struct {
	c  *Client
	wg sync.WaitGroup // run and its goroutines: Client.Close waits for them

	mu      sync.Mutex
	locks   map[string]map[noticeTarget]bool // by session id: the handles that want notices now
	again   map[noticeTarget]bool            // handles that hold already: their pending requests are read again
	fresh   chan struct{}                    // buffered 1: a lock was added or removed
	stop    chan struct{}                    // closed by Client.Close
	running bool
	stopped bool
	oldSrv  bool // a server did not know SubscribeNotices (logged once)
}

func (h *noticeHub) init(c *Client) {
	h.c = c
	h.locks = map[string]map[noticeTarget]bool{}
	h.again = map[noticeTarget]bool{}
	h.fresh = make(chan struct{}, 1)
	h.stop = make(chan struct{})
}

// close stops the hub's goroutines and waits for them (Client.Close).
func (h *noticeHub) close() {
	h.mu.Lock()
	if !h.stopped {
		h.stopped = true
		close(h.stop)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// add makes l's session deliver its notices to l (l acquires or holds).
func (h *noticeHub) add(l noticeTarget) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	id := l.noticeSession().id
	if h.locks[id] == nil {
		h.locks[id] = map[noticeTarget]bool{}
	}
	h.locks[id][l] = true
	if !h.running {
		h.running = true
		h.wg.Go(h.run)
	}
	h.mu.Unlock()
	h.wake()
}

// readAgain asks for l's pending requests again: l was added while it
// already held (ReleaseRequested called after the grant), so a request
// made before then went to no handle. The session subscribes again on its
// stream (the server then sends its pending requests anew), or the watch
// of l's names starts again (it reads them when it starts).
func (h *noticeHub) readAgain(l noticeTarget) {
	h.mu.Lock()
	h.again[l] = true
	h.mu.Unlock()
	h.wake()
}

// takeAgain returns and forgets the handles readAgain named.
func (h *noticeHub) takeAgain() []noticeTarget {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]noticeTarget, 0, len(h.again))
	for l := range h.again {
		out = append(out, l)
	}
	clear(h.again)
	return out
}

// remove forgets l (its hold ended, or its acquire failed).
func (h *noticeHub) remove(l noticeTarget) {
	h.mu.Lock()
	id := l.noticeSession().id
	delete(h.again, l)
	delete(h.locks[id], l)
	if len(h.locks[id]) == 0 {
		delete(h.locks, id)
	}
	h.mu.Unlock()
	h.wake()
}

func (h *noticeHub) wake() {
	select {
	case h.fresh <- struct{}{}:
	default:
	}
}

// deliver hands a notice to the locks it concerns (the streams' reader
// calls it: it never blocks).
func (h *noticeHub) deliver(n *lockdv1.ReleaseRequested) {
	h.mu.Lock()
	ls := make([]noticeTarget, 0, len(h.locks[n.GetSessionId()]))
	for l := range h.locks[n.GetSessionId()] {
		ls = append(ls, l)
	}
	h.mu.Unlock()
	r := ReleaseRequest{Name: n.GetName(), Token: n.GetToken(), Reason: n.GetReason(), RevokeGrace: n.GetRevokeGrace().AsDuration()}
	if n.GetRequestedAt() != nil {
		r.RequestedAt = n.GetRequestedAt().AsTime()
	}
	r.RevokeAt = revokeAt(r.RevokeGrace, n.GetRevokeGraceFrom(), r.RequestedAt)
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
		for l := range ls {
			s := l.noticeSession()
			if s.ctx.Err() != nil {
				delete(h.locks, id)
			} else {
				ss = append(ss, s)
			}
			break
		}
	}
	return ss
}

// names returns the names of the live locks that want notices.
func (h *noticeHub) names() map[string]bool {
	names := map[string]bool{}
	for _, s := range h.sessions() {
		h.mu.Lock()
		for l := range h.locks[s.id] {
			for _, n := range l.noticeNames() {
				names[n] = true
			}
		}
		h.mu.Unlock()
	}
	return names
}

// unknownFrame reports whether a SubscribeNotices failed because the
// server does not know it (a server older than the frame).
func unknownFrame(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnimplemented:
		return true
	case connect.CodeInvalidArgument:
		// What a server without SubscribeNotices answers a frame it cannot
		// read (it sees no body, or one it does not know); any other
		// invalid argument is not an older server.
		return strings.Contains(err.Error(), "stream request without a") // "body" or "known body"
	}
	return false
}

// run keeps every session that wants notices subscribed on a stream,
// until the client closes; without a stream, it watches instead.
func (h *noticeHub) run() {
	c := h.c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.wg.Go(func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	})
	var st *wire.Stream
	var opened time.Time
	subscribed := map[*Session]bool{}
	attempt := 0
	var retry backoff
	for ctx.Err() == nil {
		if !c.cfg.stream {
			h.watchUnary(ctx, nil)
			return
		}
		if st == nil {
			if !opened.IsZero() && time.Since(opened) < noticeRetry {
				// The last stream died young: no tight loop of streams,
				// each making the server send every pending request.
				h.pause(ctx, nil, retry.wait())
			}
			opened = time.Now()
			var err error
			st, err = c.call.OpenStream(ctx, c.eps.At(attempt))
			if errors.Is(err, wire.ErrNoStream) {
				c.logger.Info("release-request notices: no session stream; watching the locks instead")
				h.watchUnary(ctx, time.After(unaryNoticesFor))
				continue
			}
			if err != nil {
				attempt++
				h.pause(ctx, nil, retry.wait())
				continue
			}
			clear(subscribed)
		}
		failed, old := h.subscribe(ctx, st, subscribed)
		if old {
			h.logOldServer()
			h.watchUnary(ctx, time.After(unaryNoticesFor))
			continue
		}
		if failed {
			attempt++
		} else if time.Since(opened) >= noticeRetry {
			retry.reset()
		}
		select {
		case <-st.Done():
			st = nil
		default:
			if failed {
				h.pause(ctx, st.Done(), retry.wait())
			} else {
				h.pause(ctx, st.Done(), 0, h.fresh)
			}
			select {
			case <-st.Done():
				st = nil
			default:
			}
		}
	}
}

// subscribe subscribes on st the live sessions not subscribed yet: failed
// when one failed, old when the server does not know SubscribeNotices.
func (h *noticeHub) subscribe(ctx context.Context, st *wire.Stream, subscribed map[*Session]bool) (failed, old bool) {
	c := h.c
	live := h.sessions()
	for s := range subscribed {
		if s.ctx.Err() != nil {
			delete(subscribed, s)
		}
	}
	for _, l := range h.takeAgain() {
		delete(subscribed, l.noticeSession()) // subscribing again re-sends
	}
	for _, s := range live {
		if subscribed[s] {
			continue
		}
		sctx, scancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
		err := st.SubscribeNotices(sctx, s.id, s.secret)
		scancel()
		if err != nil {
			if unknownFrame(err) && s.ctx.Err() == nil {
				c.logger.Debug("release-request notices: subscribe not known", "session", s.id, "err", err)
				return true, true
			}
			if s.ctx.Err() == nil {
				c.logger.Debug("release-request notices: subscribe failed", "session", s.id, "err", err)
			}
			failed = true
			continue
		}
		subscribed[s] = true
	}
	return failed, false
}

// logOldServer says once that a server does not know SubscribeNotices.
func (h *noticeHub) logOldServer() {
	h.mu.Lock()
	first := !h.oldSrv
	h.oldSrv = true
	h.mu.Unlock()
	if first {
		h.c.logger.Warn("release-request notices: the server does not know SubscribeNotices (older than the client); watching the locks instead")
	}
}

// pause waits d (or for one of chs, forever when d is 0 and chs has the
// hub's fresh channel), or ctx.
func (h *noticeHub) pause(ctx context.Context, done <-chan struct{}, d time.Duration, fresh ...chan struct{}) {
	var timer <-chan time.Time
	var wake chan struct{}
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	if len(fresh) > 0 {
		wake = fresh[0]
	}
	select {
	case <-ctx.Done():
	case <-done:
	case <-timer:
	case <-wake:
	}
}
