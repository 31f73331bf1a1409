package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/guard"
)

// This file is the Raft port over TLS: a raft.StreamLayer that
// authenticates before it allocates. hashicorp/raft's NetworkTransport
// gives every connection Accept returns a 256 KiB read buffer and a
// goroutine at once, and reads from it with no deadline; so Accept here
// returns only connections whose TLS handshake has completed and whose
// peer's certificate is a member's (certs.Material.VerifyMember, checked
// inside the handshake). Handshakes run in goroutines of their own, each
// within RaftHandshakeTimeout, and at most maxRaftHandshakesPerSource of
// them per source address (maxRaftHandshakes in all) at once: a connection
// beyond a cap is closed at once, unless it comes from another member's
// address (the Raft configuration), so that a flood cannot keep a member
// out. Authenticated connections are never
// capped: a member's pooled connections and pipeline are never refused
// once they are in. See docs/security.md, "The Raft port".
//
// The plaintext transport (loopback, or --insecure) is hashicorp/raft's
// own TCP transport, unbounded: it authenticates no one, so whoever can
// connect can already send entries as a leader, and bounding its memory
// would protect nothing.

const (
	// RaftHandshakeTimeout bounds a TLS handshake on the Raft port, from
	// accept to the member check: a peer on any working network completes
	// one in milliseconds, and one that stays idle or trickles bytes holds
	// its slot at most this long.
	RaftHandshakeTimeout = 5 * time.Second
	// maxRaftHandshakesPerSource caps the handshakes in progress at once
	// from one source: an IPv4 address, or an IPv6 /64 (what one host
	// usually has). A member makes a handful at a time (a pool of 3 and a
	// pipeline per peer), and a few nodes may share an address.
	maxRaftHandshakesPerSource = 32
	// maxRaftHandshakes caps the handshakes in progress at once from all
	// sources: tens of KiB each (a goroutine, the TLS state, a record
	// buffer), tens of MiB in all at most.
	maxRaftHandshakes = 512
	// raftRefusalWindow is how long the refused connections after a logged
	// one are counted into a single line.
	raftRefusalWindow = 10 * time.Second
)

// tlsStream is a raft.StreamLayer over mutual TLS: both sides present a
// member's certificate, so a machine without one can neither send Raft
// RPCs (votes, entries) to a node nor receive them from it.
type tlsStream struct {
	l     net.Listener // the TCP listener
	adv   net.Addr
	store *certs.Store
	cfg   *tls.Config // the Raft listener's (certs.Store.PeerServerConfig)
	// member reports whether an address is another member's (from the
	// Raft configuration): its handshakes are never capped, so a flood
	// from other addresses cannot keep a member out.
	member func(netip.Addr) bool

	ready   chan net.Conn // authenticated connections, for Accept
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
	refused *refusalLog

	mu        sync.Mutex
	conns     map[net.Conn]struct{} // every open connection: in handshake or accepted
	handshake int                   // connections in handshake
	perSource map[netip.Addr]int    // connections in handshake by source
	closed    bool
}

// newTLSStream serves the Raft port on l: it starts the goroutine that
// accepts connections and hands each to a handshake.
func newTLSStream(l net.Listener, adv net.Addr, store *certs.Store, log hclog.Logger, member func(netip.Addr) bool) *tlsStream {
	if member == nil {
		member = func(netip.Addr) bool { return false }
	}
	t := &tlsStream{
		member:    member,
		l:         l,
		adv:       adv,
		store:     store,
		cfg:       store.PeerServerConfig(),
		ready:     make(chan net.Conn),
		done:      make(chan struct{}),
		refused:   &refusalLog{log: log, window: raftRefusalWindow},
		conns:     map[net.Conn]struct{}{},
		perSource: map[netip.Addr]int{},
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t
}

// Accept returns the next connection whose handshake has completed with a
// member, tracked so that Close ends it: hashicorp/raft's
// NetworkTransport.Close closes only the stream layer, which would leave
// the goroutine serving each accepted connection reading until the peer
// hangs up.
func (t *tlsStream) Accept() (net.Conn, error) {
	select {
	case c := <-t.ready:
		return c, nil
	case <-t.done:
		return nil, net.ErrClosed
	}
}

// acceptLoop accepts TCP connections until Close, and starts a handshake
// for each one the caps allow.
func (t *tlsStream) acceptLoop() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.l.Accept()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			// Out of file descriptors, say: back off as net/http does,
			// rather than spin, and log it once per window.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.refused.add(nil, "accept_error", err)
			select {
			case <-t.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		ip, src, _ := guard.SourceOf(c.RemoteAddr())
		t.mu.Lock()
		over := t.handshake >= maxRaftHandshakes || t.perSource[src] >= maxRaftHandshakesPerSource
		t.mu.Unlock()
		// Read only over a cap (it reads the Raft configuration), and
		// outside the lock.
		over = over && !t.member(ip)
		t.mu.Lock()
		switch {
		case t.closed:
			t.mu.Unlock()
			c.Close()
			return
		case over:
			t.mu.Unlock()
			c.Close()
			t.refused.add(c.RemoteAddr(), "over_cap", nil)
			continue
		}
		t.handshake++
		t.perSource[src]++
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serveHandshake(c, src)
	}
}

// serveHandshake completes the TLS handshake of c (the member check is
// part of it) within RaftHandshakeTimeout and hands the connection to
// Accept, or closes it.
func (t *tlsStream) serveHandshake(c net.Conn, src netip.Addr) {
	defer t.wg.Done()
	tc := tls.Server(c, t.cfg)
	c.SetDeadline(time.Now().Add(RaftHandshakeTimeout))
	err := tc.Handshake()
	if err == nil {
		err = c.SetDeadline(time.Time{})
	}
	t.mu.Lock()
	t.handshake--
	if t.perSource[src]--; t.perSource[src] == 0 {
		delete(t.perSource, src)
	}
	delete(t.conns, c)
	var tracked *trackedConn
	if err == nil && !t.closed {
		tracked = &trackedConn{Conn: tc, s: t}
		t.conns[tracked] = struct{}{}
	}
	t.mu.Unlock()
	if tracked == nil {
		c.Close()
		if err != nil {
			t.refused.add(c.RemoteAddr(), refusalReason(err), err)
		}
		return
	}
	select {
	case t.ready <- tracked:
	case <-t.done:
		tracked.Close()
	}
}

// refusalReason names why a handshake failed, for the log.
func refusalReason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, certs.ErrNotMember):
		return "not_member"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "handshake_failed"
}

// Close closes the listener and every connection, in handshake or
// accepted, and waits for the goroutines of the accept loop and the
// handshakes to end.
func (t *tlsStream) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	conns := t.conns
	t.conns = map[net.Conn]struct{}{}
	t.mu.Unlock()
	err := t.l.Close()
	for c := range conns {
		if tc, ok := c.(*trackedConn); ok {
			c = tc.Conn
		}
		c.Close()
	}
	t.wg.Wait()
	t.refused.close()
	return err
}

// trackedConn is an accepted connection that leaves its stream's set when
// closed.
type trackedConn struct {
	net.Conn
	s *tlsStream
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// Addr returns the address peers dial: the advertised one, if given.
func (t *tlsStream) Addr() net.Addr {
	if t.adv != nil {
		return t.adv
	}
	return t.l.Addr()
}

// Dial connects to a peer's Raft port and completes the handshake within
// timeout, checking the peer's certificate against the address dialled
// and that it is a member's.
func (t *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return t.store.DialPeer(ctx, "tcp", string(addr), []string{certs.PeerProto})
}

// OpenTLSTransport is openTransport's TLS branch.
func OpenTLSTransport(cfg Config, store *certs.Store, adv net.Addr, hl hclog.Logger, member func(netip.Addr) bool) (raft.Transport, error) {
	st, err := listenTLSStream(cfg, store, adv, hl, member)
	if err != nil {
		return nil, err
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: st, MaxPool: 3, Timeout: 10 * time.Second, Logger: hl}), nil
}

// listenTLSStream listens on cfg.RaftListen and serves the Raft port's
// TLS on it.
func listenTLSStream(cfg Config, store *certs.Store, adv net.Addr, hl hclog.Logger, member func(netip.Addr) bool) (*tlsStream, error) {
	if a, ok := adv.(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		return nil, fmt.Errorf("raft-advertise %q is not an address peers can dial", adv)
	}
	l, err := net.Listen("tcp", cfg.RaftListen)
	if err != nil {
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err)
	}
	addr := adv
	if addr == nil {
		addr = l.Addr()
	}
	if a, ok := addr.(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		l.Close()
		return nil, fmt.Errorf("raft-listen %q is a wildcard address: give --raft-advertise", cfg.RaftListen)
	}
	return newTLSStream(l, adv, store, hl, member), nil
}

// refusalLog logs the connections the Raft port refuses without a line per
// connection: the first one of a window gets a line at once, the next ones
// within the window are counted (by reason) into one line when it ends, or
// when the port closes.
type refusalLog struct {
	log    hclog.Logger
	window time.Duration

	mu      sync.Mutex
	timer   *time.Timer // an open window
	counts  map[string]int
	last    net.Addr // the last refused in the window
	lastErr error
	firstAt time.Time
	closed  bool
	lines   int // lines written, for tests
}

// add records a refused connection from remote (nil: none accepted).
func (r *refusalLog) add(remote net.Addr, reason string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.timer != nil {
		if r.counts == nil {
			r.counts = map[string]int{}
		}
		r.counts[reason]++
		r.last, r.lastErr = remote, err
		return
	}
	args := []any{"reason", reason}
	if remote != nil {
		args = append(args, "remote", remote.String())
	}
	if err != nil {
		args = append(args, "err", err)
	}
	r.log.Warn("raft port: refused a connection (more within the next "+r.window.String()+" are counted into one line)", args...)
	r.lines++
	r.firstAt = time.Now()
	r.timer = time.AfterFunc(r.window, r.endWindow)
}

// endWindow writes the line of the window's counted refusals, if any.
func (r *refusalLog) endWindow() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.flush()
	r.timer = nil
}

// flush writes the counted refusals; r.mu is held.
func (r *refusalLog) flush() {
	n := 0
	for _, c := range r.counts {
		n += c
	}
	if n == 0 {
		return
	}
	args := []any{"count", n, "since", r.firstAt.UTC().Format(time.RFC3339)}
	for _, reason := range []string{"not_member", "handshake_failed", "timeout", "over_cap", "accept_error"} {
		if c := r.counts[reason]; c > 0 {
			args = append(args, reason, c)
		}
	}
	if r.last != nil {
		args = append(args, "last_remote", r.last.String())
	}
	if r.lastErr != nil {
		args = append(args, "last_err", r.lastErr)
	}
	r.log.Warn("raft port: refused more connections", args...)
	r.lines++
	r.counts, r.last, r.lastErr = nil, nil, nil
}

// close writes the open window's line and counts nothing more.
func (r *refusalLog) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
	r.flush()
}
