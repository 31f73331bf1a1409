package wire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"connectrpc.com/connect"
)

// The session stream: one HTTP/2 stream per (client, endpoint) carrying
// every session-scoped call as a frame (SessionService.Stream), instead of
// one HTTP exchange per call. It is transport only: the retry loop runs
// above it unchanged, a broken stream fails its pending calls with an
// "outcome unknown" error that the loop retries with the same seq, and an
// endpoint where no stream can be opened (a proxy that does not pass
// HTTP/2) is used over unary HTTP/1.1 instead.

// unaryFor is how long an endpoint where no stream could be opened is used
// unary only before a stream is tried again.
const unaryFor = time.Minute

// ErrNoStream says a call cannot go over a stream on this endpoint now;
// the caller sends it unary.
var ErrNoStream = errors.New("no session stream")

// ErrStreamBroken marks the error of a call cut by a broken stream.
var ErrStreamBroken = errors.New("session stream broke; outcome unknown")

// StreamSlot is an endpoint's stream state.
type StreamSlot struct {
	mu        sync.Mutex
	cur       *Stream
	opening   chan struct{} // closed when the open in progress ends; nil if none
	unaryTill time.Time     // no stream could be opened: unary until then
	open      atomic.Bool
}

// IsOpen reports whether the endpoint has an open stream.
func (slot *StreamSlot) IsOpen() bool { return slot.open.Load() }

// Current returns the endpoint's open stream, or nil.
func (slot *StreamSlot) Current() *Stream {
	slot.mu.Lock()
	defer slot.mu.Unlock()
	return slot.cur
}

// Stream is one open session stream.
type Stream struct {
	url    string
	slot   *StreamSlot
	st     *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse]
	cancel context.CancelFunc
	sendMu sync.Mutex    // held by the call sending queued requests (streamsend.go)
	sendQ  sendQueue     // requests not yet sent
	more   *atomic.Int32 // the request body's moreHint; nil if none

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *lockdv1.StreamResponse
	err     error // why the stream ended; each caller gets its own connect.Error (failure)
	done    chan struct{}

	acquires chan struct{} // Acquires in flight, at most maxStreamAcquires

	notice func(*lockdv1.ReleaseRequested) // Caller.OnNotice; nil: notices dropped

	heard  atomic.Int64 // MonoNow of the last frame read
	silent *time.Timer  // on an upgraded connection: fails the stream when the node falls silent
}

// maxStreamAcquires bounds the Acquires one stream has in flight: half of
// what the server serves at once per stream (256), so that parked long
// polls never fill the server's pool and hold up other calls.
const maxStreamAcquires = 128

// NewStream returns the stream st to url, open (its hello received), for
// slot; cancel ends it.
func NewStream(url string, slot *StreamSlot, st *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse], cancel context.CancelFunc) *Stream {
	s := &Stream{url: url, slot: slot, st: st, cancel: cancel, pending: map[uint64]chan *lockdv1.StreamResponse{}, done: make(chan struct{}),
		acquires: make(chan struct{}, maxStreamAcquires)}
	s.heard.Store(MonoNow())
	return s
}

// SilenceLimit is how long a stream on an upgraded connection may go
// without a frame before the client takes its node for frozen and fails
// it (its calls are re-sent, elsewhere if need be). The node sends an
// empty frame when it wrote nothing for a second (api.HeartbeatEvery,
// checked every half second), so a live node is heard at least every
// 1.5 s; HTTP/2 pings (1 s
// after the last frame, 1 s to answer) did this on HTTP/2 connections.
const SilenceLimit = 3 * time.Second

// watchSilence fails the stream once nothing was read from it for
// SilenceLimit.
func (s *Stream) watchSilence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.silent = time.AfterFunc(SilenceLimit, s.checkSilence)
}

func (s *Stream) checkSilence() {
	quiet := time.Duration(MonoNow() - s.heard.Load())
	if quiet >= SilenceLimit {
		s.Fail(fmt.Errorf("nothing heard from the node for %v: taken for frozen", quiet.Round(time.Millisecond)))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.silent.Reset(SilenceLimit - quiet)
	}
}

// Dialer opens a stream for Open: unary reports that the endpoint answered
// without one (it is then used unary for a while).
type Dialer func(ctx context.Context) (s *Stream, unary bool, err error)

// Open returns the slot's open stream, or opens one with dial. The slot's
// lock is never held over the network: one caller opens while the others
// wait for it as long as their own ctx allows (a keepalive must not wait
// out an Acquire's long-poll budget behind a hung dial). usable says the
// endpoint may have a stream at all, closed whether the client closed;
// aborted is the error of a call whose ctx ended while it waited.
func (slot *StreamSlot) Open(ctx context.Context, usable bool, closed func() bool, dial Dialer, aborted func(context.Context) error) (*Stream, error) {
	for {
		slot.mu.Lock()
		if s := slot.cur; s != nil {
			slot.mu.Unlock()
			return s, nil
		}
		if !usable || time.Now().Before(slot.unaryTill) || closed() {
			slot.mu.Unlock()
			return nil, ErrNoStream
		}
		if w := slot.opening; w != nil {
			slot.mu.Unlock()
			select {
			case <-w:
				continue // opened, or failed: look again
			case <-ctx.Done():
				return nil, aborted(ctx)
			}
		}
		w := make(chan struct{})
		slot.opening = w
		slot.mu.Unlock()

		s, unary, err := dial(ctx)
		slot.mu.Lock()
		slot.opening = nil
		close(w)
		if s != nil && closed() {
			s.cancel()
			s, err = nil, ErrNoStream
		}
		if s != nil {
			slot.cur = s
			slot.open.Store(true)
		}
		if unary {
			slot.unaryTill = time.Now().Add(unaryFor)
		}
		slot.mu.Unlock()
		if s == nil {
			return nil, err
		}
		go s.read()
		return s, nil
	}
}

// Close ends the stream for good (the client closes): the request side is
// closed and pending calls fail with cause.
func (s *Stream) Close(cause error) {
	s.sendMu.Lock()
	_ = s.st.CloseRequest()
	s.sendMu.Unlock()
	s.Fail(cause)
}

// read delivers answers to their calls until the stream breaks.
func (s *Stream) read() {
	for {
		r, err := s.st.Receive()
		if err != nil {
			s.Fail(err)
			return
		}
		s.heard.Store(MonoNow())
		if r.GetCallId() == 0 {
			// A notice, after a SubscribeNotices (notices.go); no call
			// waits for it.
			if n := r.GetReleaseRequested(); n != nil && s.notice != nil {
				s.notice(n)
			}
			continue
		}
		s.mu.Lock()
		ch := s.pending[r.GetCallId()]
		delete(s.pending, r.GetCallId())
		s.mu.Unlock()
		if ch != nil {
			ch <- r // buffered; an answer to an abandoned call is dropped
		}
	}
}

// Fail ends the stream: every pending call fails with an "outcome unknown"
// error (the retry loop re-sends each with its seq), and the endpoint's
// next call opens a new stream.
func (s *Stream) Fail(cause error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("%w: %s: %w", ErrStreamBroken, s.url, cause)
		close(s.done)
	}
	if s.silent != nil {
		s.silent.Stop()
	}
	s.mu.Unlock()
	s.cancel()
	slot := s.slot
	slot.mu.Lock()
	if slot.cur == s {
		slot.cur = nil
		slot.open.Store(false)
	}
	slot.mu.Unlock()
}

// failure is the error a call sees once the stream has ended: a new
// connect.Error per call, since callers read (and connect.Error.Meta
// lazily writes) its metadata concurrently.
func (s *Stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connect.NewError(connect.CodeUnavailable, s.err)
}

// answerChans recycles the channels calls wait on. A channel goes back
// only after its answer was received: one left by a call whose ctx or
// stream ended may still get a late answer, and is dropped.
var answerChans = sync.Pool{New: func() any { return make(chan *lockdv1.StreamResponse, 1) }}

// Call sends one request and waits for its answer, the stream's end or
// ctx.
func (s *Stream) Call(ctx context.Context, req *lockdv1.StreamRequest) (*lockdv1.StreamResponse, error) {
	if _, ok := req.GetBody().(*lockdv1.StreamRequest_Acquire); ok {
		// At most maxStreamAcquires Acquires (each may park for a long
		// poll) in flight, fewer than the server serves at once, so a
		// KeepAlive, Release or Cancel never waits behind them.
		select {
		case s.acquires <- struct{}{}:
			defer func() { <-s.acquires }()
		case <-s.done:
			return nil, s.failure()
		case <-ctx.Done():
			return nil, CtxError(ctx, ctx.Err())
		}
	}
	ch := answerChans.Get().(chan *lockdv1.StreamResponse)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.failure()
	}
	s.nextID++
	id := s.nextID
	s.pending[id] = ch
	s.mu.Unlock()
	req.CallId = id
	s.send(req)
	select {
	case r := <-ch:
		answerChans.Put(ch) // delivered: nothing else sends on it
		if e := r.GetError(); e != nil {
			return nil, FromStreamError(e)
		}
		return r, nil
	case <-s.done:
		s.withdraw(req)
		return nil, s.failure()
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
		s.withdraw(req)
		return nil, CtxError(ctx, ctx.Err())
	}
}
