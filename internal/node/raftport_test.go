package node

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/sockettest"
)

// TestRaftRefusalLogAggregates: the first refused connection of a window
// gets a line, the rest of the window one line with the counts; Close
// writes the open window's line and nothing is logged after it.
func TestRaftRefusalLogAggregates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		r := &refusalLog{log: hclog.New(&hclog.LoggerOptions{Output: &buf}), window: raftRefusalWindow}
		// lines returns the lines written and the log, under the lock
		// they are written under.
		lines := func() (int, string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.lines, buf.String()
		}
		addr := &net.TCPAddr{IP: net.ParseIP("10.0.0.9"), Port: 4242}
		for range 1000 {
			r.add(addr, "timeout", nil)
		}
		r.add(addr, "not_member", certs.ErrNotMember)
		if n, _ := lines(); n != 1 {
			t.Fatalf("%d lines for a burst, want 1", n)
		}
		time.Sleep(raftRefusalWindow)
		synctest.Wait()
		if n, log := lines(); n != 2 || !strings.Contains(log, "count=1000") || !strings.Contains(log, "timeout=999") || !strings.Contains(log, "not_member=1") {
			t.Fatalf("%d lines:\n%s", n, log)
		}
		r.add(addr, "over_cap", nil) // a new window: a line at once
		r.add(addr, "over_cap", nil)
		r.close()
		r.add(addr, "over_cap", nil)
		if n, log := lines(); n != 4 {
			t.Fatalf("%d lines, want 4:\n%s", n, log)
		}
	})
}

// TestRaftPortCapsSpareMembers: a flood that
// holds every handshake slot — maxRaftHandshakes idle connections from
// several sources, none over its own cap — must not keep out a member,
// recognised by its address (the Raft configuration's, here the member
// func), nor a member from a flooding source; a stranger beyond the cap is
// closed at once.
func TestRaftPortCapsSpareMembers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := newTestPKI(t)
	nodeCrt, nodeKey := p.issue(t, certs.Node, "n1")
	st, err := certs.Load(certs.Files{CA: p.caFile, Cert: nodeCrt, Key: nodeKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.RaftListen = "127.0.0.1:0"
	member := func(ip netip.Addr) bool {
		return ip == netip.MustParseAddr("127.0.1.1") || ip == netip.MustParseAddr("127.0.2.1")
	}
	s, err := listenTLSStream(cfg, st, nil, hclog.NewNullLogger(), member)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	accepted := acceptAll(s, 4)
	addr := s.Addr().String()
	dialFrom := func(from string) net.Conn {
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Every slot taken: maxRaftHandshakes idle connections, at most the
	// per-source cap from each source; 127.0.2.1 (a member's address)
	// floods too.
	sources := []string{"127.0.2.1"}
	for i := 0; len(sources)*maxRaftHandshakesPerSource < maxRaftHandshakes; i++ {
		sources = append(sources, fmt.Sprintf("127.0.3.%d", i+1))
	}
	for _, src := range sources {
		for range maxRaftHandshakesPerSource {
			dialFrom(src)
		}
	}
	// The accept loop counts connections as it takes them: wait until a
	// stranger is refused, which proves every slot is held.
	for deadline := time.Now().Add(RaftHandshakeTimeout); ; {
		c := dialFrom("127.0.4.1")
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			break // closed at once: over the cap
		}
		if time.Now().After(deadline) {
			t.Fatal("a stranger was not refused with every handshake slot held")
		}
	}
	for _, from := range []string{"127.0.1.1", "127.0.2.1"} {
		tc := p.tlsConfigFor(t, nodeCrt, nodeKey)
		tc.NextProtos = []string{certs.PeerProto}
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := tls.DialWithDialer(d, "tcp", addr, tc)
		if err != nil {
			t.Fatalf("member from %s with every slot held: %v", from, err)
		}
		defer c.Close()
		got := <-accepted
		defer got.Close()
		if ip := got.RemoteAddr().(*net.TCPAddr).IP.String(); ip != from {
			t.Fatalf("accepted %s, want the member from %s", ip, from)
		}
	}
}

// acceptAll hands what s accepts to the channel it returns (buffered by n),
// closed when s is.
func acceptAll(s *tlsStream, n int) <-chan net.Conn {
	accepted := make(chan net.Conn, n)
	go func() {
		for {
			c, err := s.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	return accepted
}

// TestRaftPortAcceptsOnlyMembers: the stream
// layer's Accept returns only connections whose handshake completed with a
// member: a client certificate's never reaches Raft (not one byte read by
// it), a member's does. Idle connections beyond the per-source cap are
// closed at once, the ones within it at the handshake deadline; the cap
// counts only handshakes, so any number of authenticated connections from
// the same source stay open, and another source is served meanwhile.
// Close ends every connection and goroutine.
func TestRaftPortAcceptsOnlyMembers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := newTestPKI(t)
	nodeCrt, nodeKey := p.issue(t, certs.Node, "n1")
	st, err := certs.Load(certs.Files{CA: p.caFile, Cert: nodeCrt, Key: nodeKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	var logMu sync.Mutex
	cfg := DefaultConfig()
	cfg.RaftListen = "127.0.0.1:0"
	s, err := listenTLSStream(cfg, st, nil, hclog.New(&hclog.LoggerOptions{Output: lockedWriter{&logMu, &logged}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	accepted := acceptAll(s, 100)
	addr := s.Addr().String()
	dial := func(from, crt, key string) (*tls.Conn, error) {
		tc := p.tlsConfigFor(t, crt, key)
		tc.NextProtos = []string{certs.PeerProto}
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := tls.DialWithDialer(d, "tcp", addr, tc)
		if err != nil {
			return nil, err
		}
		return c, nil
	}

	appCrt, appKey := p.issue(t, certs.Client, "app")
	if c, err := dial("127.0.0.1", appCrt, appKey); err == nil {
		c.SetReadDeadline(time.Now().Add(RaftHandshakeTimeout))
		if _, err := c.Read(make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "bad certificate") {
			t.Fatalf("client certificate: read %v, want a bad certificate alert", err)
		}
		c.Close()
	}
	// Any number of members' connections from one source: more than
	// the per-source cap, each accepted after its handshake.
	var members []*tls.Conn
	for i := range maxRaftHandshakesPerSource + 8 {
		c, err := dial("127.0.0.1", nodeCrt, nodeKey)
		if err != nil {
			t.Fatalf("member connection %d: %v", i, err)
		}
		members = append(members, c)
		got := <-accepted
		if cn := got.(*trackedConn).Conn.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "n1" {
			t.Fatalf("accepted a connection of %q", cn)
		}
		defer got.Close()
	}

	// Idle connections from the same source: the cap's worth wait for
	// the deadline, the rest are closed at once.
	start := time.Now()
	var idle []net.Conn
	for range maxRaftHandshakesPerSource + 40 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	closedAt := make([]time.Duration, len(idle))
	var wg sync.WaitGroup
	for i, c := range idle {
		wg.Go(func() {
			c.SetReadDeadline(start.Add(RaftHandshakeTimeout + 5*time.Second))
			_, err := io.ReadAll(c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				closedAt[i] = -1
				return
			}
			closedAt[i] = time.Since(start)
		})
	}
	// Meanwhile a member from another source is served.
	other, err := dial("127.0.0.2", nodeCrt, nodeKey)
	if err != nil {
		t.Fatalf("a member from another source: %v", err)
	}
	defer other.Close()
	if got := <-accepted; got.RemoteAddr().(*net.TCPAddr).IP.String() != "127.0.0.2" {
		t.Fatalf("accepted %v, want the member from 127.0.0.2", got.RemoteAddr())
	} else {
		defer got.Close()
	}
	wg.Wait()
	early := 0
	for i, d := range closedAt {
		if d < 0 {
			t.Fatalf("idle connection %d still open %v after it was made", i, RaftHandshakeTimeout+5*time.Second)
		}
		if d < RaftHandshakeTimeout/2 {
			early++
		}
	}
	if elapsed := time.Since(start); elapsed < RaftHandshakeTimeout {
		t.Fatalf("all idle connections closed within %v: the deadline did not hold the capped ones", elapsed)
	}
	if early < 40 {
		t.Errorf("%d idle connections closed at once, want the 40 beyond the cap", early)
	}
	// The members' connections are still open.
	for _, c := range members {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !sockettest.IsTimeout(err) {
			t.Fatalf("a member's connection: %v, want still open", err)
		}
	}

	// Close ends the members' connections too (leakCheck checks the
	// goroutines).
	s.Close()
	for range accepted {
	}
	for _, c := range members {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); sockettest.IsTimeout(err) {
			t.Fatal("a member's connection outlived Close")
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logged.String(), "raft port: refused"); n < 1 || n > 4 {
		t.Errorf("%d lines about refused connections, want 1 to 4:\n%s", n, logged.String())
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
