package lockd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/label"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// Session is a lease on the lockd cluster, kept alive in the background.
// Every lock is taken through a session and lives at most as long as it:
// when the session ends, the server releases its holds and drops its waits.
//
// The client treats the lease as lost strictly before any server may expire
// it: at sent + TTL·0.99 − max(100 ms, 2% TTL), where sent is when the
// newest confirmed KeepAlive left the client. KeepAlive goes out about every
// TTL/3, and every TTL/10 while confirmations are late. Once lost, a session
// stays lost: Done is closed, Context is cancelled with an error matching
// ErrLeaseLost, keepalives stop, the client tries to close the session on
// the server, and every lock taken through it reports the loss. Create a new
// session to go on.
//
// A Session is safe for concurrent use.
type Session struct {
	c          *Client
	id         string
	secret     string // presented with every session-scoped call; never shown
	ttl        time.Duration
	owner      string
	deadlineFn func(time.Time)

	ctx      context.Context
	cancel   context.CancelCauseFunc
	loopDone chan struct{}
	ren      *wire.Renewal    // the keepalive scheduler's view, made by the loop's first renew
	until    func() time.Time // Deadline, as a policy's Until (made once)
	seqs     wire.SeqTracker
	bg       sync.WaitGroup

	mu         sync.Mutex
	lease      clientLease
	timer      *time.Timer // fires at lease.deadline
	err        error
	closing    bool // Close was called
	toldServer bool // CloseSession was sent (or is being sent)
}

// NewSession creates a session on the cluster and starts keeping it alive.
// The server's granted TTL is Session.TTL. It fails with ErrInvalidArgument
// for bad options and with ErrUnavailable when no endpoint could create it.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	cfg := sessionConfig{ttl: DefaultTTL, owner: defaultOwner()}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		return nil, ErrClosed
	}
	var s *Session
	for round := 1; ; round++ {
		var err error
		s, err = c.createSession(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
		if err = s.Err(); err == nil {
			break
		}
		<-s.loopDone // the loop closes the session on the server
		// Confirmed after its client deadline, as when the first attempt
		// went to a hung endpoint and the next one answered late: ask
		// again, with a new request and a new send time, now that the
		// client knows an endpoint that answers.
		if round == maxCreateRounds || ctx.Err() != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
	}
	if err := c.addSession(s); err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	c.logger.Info("session created", "session", s.id, "ttl", s.ttl)
	return s, nil
}

// maxCreateRounds bounds how often NewSession asks again after a session
// was confirmed too late to be used.
const maxCreateRounds = 3

// createSession sends one CreateSession (with retries) and starts the
// session's keepalive loop. The lease counts from the first attempt's send
// time: a retry may be answered with the session that attempt created.
func (c *Client) createSession(ctx context.Context, cfg sessionConfig) (*Session, error) {
	sent := time.Now()
	msg := &lockdv1.CreateSessionRequest{
		Ttl:       durationpb.New(cfg.ttl),
		Owner:     cfg.owner,
		RequestId: randomID(),
		// 256 random bits, made here so that a retry of this create
		// (same request id) presents the same secret.
		Secret: randomID() + randomID(),
	}
	// An answer that takes longer than the lease's whole client deadline
	// would create a session already lost: give up on such an attempt in
	// time to try another endpoint.
	p := wire.CreateSession.PolicyOf(msg)
	p.Timeout = lease.ClientDeadline(sent, cfg.ttl).Sub(sent)
	resp, err := wire.CreateSession.Invoke(ctx, c.call, p, msg, nil)
	if err != nil {
		return nil, err
	}
	ttl := resp.Msg.GetTtl().AsDuration()
	if ttl <= 0 {
		ttl = cfg.ttl
	}
	s := newSession(c, resp.Msg.GetSessionId(), ttl, cfg.owner, cfg.deadlineFn, sent)
	s.secret = msg.Secret
	s.start()
	return s, nil
}

// newSession returns a session whose lease was confirmed at sent; start
// runs its keepalive loop.
func newSession(c *Client, id string, ttl time.Duration, owner string, deadlineFn func(time.Time), sent time.Time) *Session {
	s := &Session{
		c: c, id: id, ttl: ttl, owner: owner, deadlineFn: deadlineFn,
		loopDone: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.until = s.Deadline
	s.lease.sent, s.lease.deadline = sent, lease.ClientDeadline(sent, ttl)
	if !time.Now().Before(s.lease.deadline) {
		s.lease.lost = true
		s.err = s.lostError("the session was confirmed after its client deadline")
		s.cancel(s.err)
		return s
	}
	s.timer = time.AfterFunc(time.Until(s.lease.deadline), s.expire)
	if deadlineFn != nil {
		deadlineFn(s.lease.deadline)
	}
	return s
}

func (s *Session) start() { go s.keepalive() }

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" || label.Check("owner", host) != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// randomID returns 128 random bits in hex, for CreateSession's request id.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// ID returns the session's id, as the server knows it.
func (s *Session) ID() string { return s.id }

// TTL returns the TTL the server granted.
func (s *Session) TTL() time.Duration { return s.ttl }

// Owner returns the session's owner label.
func (s *Session) Owner() string { return s.owner }

// Done returns a channel closed when the session ends: its lease was lost
// or it was closed.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Context returns a context cancelled when the session ends. Its cause
// (context.Cause) is the session's Err.
func (s *Session) Context() context.Context { return s.ctx }

// Err returns nil while the session is live, an error matching ErrLeaseLost
// after its lease was lost, or ErrSessionClosed after Close.
func (s *Session) Err() error {
	return s.live()
}

// live returns nil while the lease is live. Past the deadline it loses the
// session at once, without waiting for the deadline timer's goroutine (which
// a pause may have delayed), so no caller is told a lease is live after its
// deadline.
func (s *Session) live() error {
	s.mu.Lock()
	if s.err != nil {
		defer s.mu.Unlock()
		return s.err
	}
	if time.Now().Before(s.lease.deadline) {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.lose(s.lostError("no keepalive confirmed before the client deadline"))
	return s.Err()
}

// Deadline returns the current client-side lease deadline (with a
// monotonic clock reading): the session counts as lost from then on unless
// a KeepAlive is confirmed first.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease.deadline
}

// Close ends the session: keepalives stop, Done is closed (the contexts of
// its held locks are cancelled first), and the server is told to release
// every hold and drop every wait of the session. The server is told
// whatever the client's view of the lease (live, or already lost while the
// server may still count it), best effort: Close retries within ctx, each
// call bounded by the request timeout for a lost session; if it fails, the
// server still expires the session after its TTL. Closing a session whose
// lease was already lost, or closing twice, returns nil.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		<-s.loopDone
		return nil
	}
	s.closing = true
	lost := s.err != nil
	if !lost {
		s.err = ErrSessionClosed
		s.lease.lost = true
		if s.timer != nil {
			s.timer.Stop()
		}
	}
	s.mu.Unlock()
	if !lost {
		s.cancel(ErrSessionClosed)
	}
	<-s.loopDone
	s.bg.Wait()
	defer s.c.removeSession(s)
	if lost {
		// The keepalive loop may have stopped before it told the server.
		cctx, cancel := context.WithTimeout(ctx, s.c.cfg.requestTimeout)
		defer cancel()
		if err := s.closeOnServer(cctx); err != nil {
			s.c.logger.Debug("close of lost session failed", "session", s.id, "err", err)
		}
		return nil
	}
	if err := s.closeOnServer(ctx); err != nil {
		return fmt.Errorf("close session %s: %w", s.id, err)
	}
	s.c.logger.Info("session closed", "session", s.id)
	return nil
}

// closeOnServer sends CloseSession, once per session: a second call (Close
// after the keepalive loop closed a lost session) does nothing. A session
// the server no longer knows is closed already.
func (s *Session) closeOnServer(ctx context.Context) error {
	s.mu.Lock()
	done := s.toldServer
	s.toldServer = true
	s.mu.Unlock()
	if done {
		return nil
	}
	seq := s.seqs.Begin()
	defer seq.End()
	msg := &lockdv1.CloseSessionRequest{SessionId: s.id, Seq: seq.Seq, Secret: s.secret}
	// Each attempt gets a keepalive's time and abandons a node that does
	// not answer in it, as a keepalive does: the keepalives have stopped,
	// so nothing else would notice a node that froze (a paused leader)
	// and the holds would stay until the session expired. A re-sent
	// CloseSession keeps its seq: the server answers it once.
	p := wire.CloseSession.PolicyOf(msg)
	p.Timeout, p.Abandon = wire.KeepaliveTimeout(s.ttl, s.c.cfg.requestTimeout), true
	_, err := wire.CloseSession.Invoke(ctx, s.c.call, p, msg, nil)
	if errors.Is(err, ErrLeaseLost) {
		return nil
	}
	return err
}

func (s *Session) lostError(why string) error {
	return fmt.Errorf("%w: session %s: %s", ErrLeaseLost, s.id, why)
}

// expire runs at the lease deadline.
func (s *Session) expire() {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if d := time.Until(s.lease.deadline); d > 0 {
		// A confirmation moved the deadline after the timer fired.
		s.timer.Reset(d)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.lose(s.lostError("no keepalive confirmed before the client deadline"))
}

// lose marks the session lost with cause (unless it already ended).
func (s *Session) lose(cause error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if !errors.Is(cause, ErrLeaseLost) && !errors.Is(cause, ErrClosed) {
		cause = fmt.Errorf("%w: session %s: %w", ErrLeaseLost, s.id, cause)
	}
	s.err = cause
	s.lease.lost = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	s.cancel(cause)
	s.c.logger.Warn("session lost", "session", s.id, "err", cause)
}

// confirmed applies a confirmed KeepAlive first sent at sent.
func (s *Session) confirmed(sent time.Time, ttl time.Duration) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	moved := s.lease.confirm(sent, ttl, time.Now())
	if s.lease.lost {
		s.mu.Unlock()
		s.lose(s.lostError("keepalive confirmed after the client deadline"))
		return
	}
	deadline := s.lease.deadline
	if moved {
		s.timer.Reset(time.Until(deadline))
	}
	s.mu.Unlock()
	if moved && s.deadlineFn != nil {
		s.deadlineFn(deadline)
	}
}

// keepTrying runs try on a goroutine that Close waits for, until it
// succeeds or fails definitively, with backoff between tries, or until the
// session ends (the server then drops what try was cleaning up); then it
// runs done. When the session already ended it runs only done.
func (s *Session) keepTrying(try func() error, done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		done()
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer done()
		r := retry.New(s.ctx, wire.RetrySchedule)
		for r.Next() {
			if err := try(); err == nil || definitive(err) {
				return
			}
		}
	}()
}

// bind returns ctx, also cancelled when the session ends.
func (s *Session) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		// ctx never ends (context.Background, WithoutCancel): the
		// session's end is the only one, with no context or callback to
		// make and remove per call.
		return sessionBound{Context: ctx, sess: s.ctx}, func() {}
	}
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	return bctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// policy bounds the attempts of one of the session's calls by its lease:
// an answer that comes after the lease deadline is of no use.
func (s *Session) policy(p wire.Policy) wire.Policy {
	p.Until = s.until
	return p
}

// sessionBound is a context that never ends of its own (its values are
// the caller's) bound to a session's: it ends when the session does, with
// the session's cause. Its Value answers from the session's context first:
// that context is made from context.Background, so it holds no values but
// its own cancellation, which is how context.Cause and the contexts
// derived from this one find it (the cause, and a child registered
// directly with the session's context, without a goroutine).
type sessionBound struct {
	context.Context
	sess context.Context
}

func (b sessionBound) Done() <-chan struct{} { return b.sess.Done() }

func (b sessionBound) Err() error { return b.sess.Err() }

func (b sessionBound) Value(key any) any {
	if v := b.sess.Value(key); v != nil {
		return v
	}
	return b.Context.Value(key)
}

// NewMutex returns an exclusive lock on name, taken through this session.
// The Mutex is a handle: create it once and use it for one hold at a time.
// A bad option (see LockOption) makes every Lock and TryLock fail with an
// error matching ErrInvalidArgument.
func (s *Session) NewMutex(name string, opts ...LockOption) *Mutex {
	return &Mutex{l: newLock(s, name, nil, opts)}
}

// NewSemaphore returns a semaphore of permits holders on name, taken
// through this session. Every user of the name must agree on permits
// (otherwise Lock fails with ErrLimitMismatch). permits must be positive:
// with 0, or a bad option, every Lock and TryLock fails with an error
// matching ErrInvalidArgument.
func (s *Session) NewSemaphore(name string, permits uint32, opts ...LockOption) *Semaphore {
	l := newLock(s, name, &permits, opts)
	if permits == 0 && l.bad == nil {
		l.bad = fmt.Errorf("%w: semaphore %q needs at least one permit", ErrInvalidArgument, name)
	}
	return &Semaphore{l: l, permits: permits}
}

// NewRWMutex returns a read-write lock on name, taken through this session:
// any number of readers, or one writer. A waiting writer holds back readers
// that come after it, so writers do not starve. A bad option makes every
// lock call fail with an error matching ErrInvalidArgument.
func (s *Session) NewRWMutex(name string, opts ...LockOption) *RWMutex {
	var unbounded uint32
	return &RWMutex{l: newLock(s, name, &unbounded, opts)}
}
