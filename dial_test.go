package lockd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// closedPort returns an address where nothing listens (connections are
// refused).
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// raftPort starts hashicorp/raft's own TCP transport (what a lockd node's
// Raft port runs) and returns its address.
func raftPort(t *testing.T) string {
	t.Helper()
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return string(tr.LocalAddr())
}

func listLocks(ctx context.Context, c *lockd.Client) error {
	_, err := c.Service().ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{}))
	return err
}

// With nothing listening, a client with a connect
// timeout (the CLI's 5 s) answers within about a second, with an error that
// matches ErrUnavailable and wraps the refusal (errors.Is ECONNREFUSED), for
// a call and for a new session.
func TestRefusedAnswersFast(t *testing.T) {
	addrs := []string{closedPort(t), closedPort(t)}
	for _, eps := range [][]string{addrs[:1], addrs} {
		c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(eps...), lockd.WithConnectTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		for name, call := range map[string]func(context.Context) error{
			"list":    func(ctx context.Context) error { return listLocks(ctx, c) },
			"session": func(ctx context.Context) error { _, err := c.NewSession(ctx); return err },
		} {
			start := time.Now()
			err := call(t.Context())
			took := time.Since(start)
			if !errors.Is(err, lockd.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%v %s: got %v, want ErrUnavailable wrapping ECONNREFUSED", eps, name, err)
			}
			for _, ep := range eps {
				if err != nil && !strings.Contains(err.Error(), ep) {
					t.Errorf("%v %s: %q does not name %s", eps, name, err, ep)
				}
			}
			if took > 3*time.Second {
				t.Errorf("%v %s: answered after %v, want about a second", eps, name, took)
			}
		}
	}
}

// A refused endpoint beside a live one costs nothing: calls and sessions
// go to the live one (failover), however often the refused one is first.
func TestRefusedEndpointFailsOver(t *testing.T) {
	srv := lockdtest.New(t)
	for range 5 {
		c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(closedPort(t), srv.URL()), lockd.WithConnectTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := listLocks(t.Context(), c); err != nil {
			t.Fatalf("list with one endpoint refused: %v", err)
		}
		s, err := c.NewSession(t.Context())
		if err != nil {
			t.Fatalf("session with one endpoint refused: %v", err)
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		c.Close(context.Background())
	}
}

// A client pointed at a Raft port (hashicorp/raft's
// transport, which hangs up on anything else) says so within about a
// second, for a call and for a new session (over the session stream), and
// does not retry it; beside a live endpoint, the Raft port is passed over.
func TestRaftPortNamed(t *testing.T) {
	addr := raftPort(t)
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(addr), lockd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for name, call := range map[string]func(context.Context) error{
		"list":    func(ctx context.Context) error { return listLocks(ctx, c) },
		"session": func(ctx context.Context) error { _, err := c.NewSession(ctx); return err },
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		want := addr + " does not speak the lockd API (is it the Raft port?"
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, lockd.ErrUnavailable) {
			t.Errorf("%s: got %v, want ErrUnavailable saying %q", name, err, want)
		}
		if took > 3*time.Second {
			t.Errorf("%s: answered after %v, want about a second", name, took)
		}
	}

	srv := lockdtest.New(t)
	c2, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(raftPort(t), srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(context.Background())
	for range 3 {
		if err := listLocks(t.Context(), c2); err != nil {
			t.Fatalf("list with a Raft port beside a live endpoint: %v", err)
		}
	}
}

// With TLS, a Raft port accepts only its own ALPN protocol (lockd-raft,
// the node's real peer TLS configuration here): a client offering the
// API's is told it reached the Raft port, within about a second.
func TestRaftPortNamedTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := certs.Issue(ca, certs.Node, "n1", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	files := certs.Files{CA: write("ca.crt", ca.Cert), Cert: write("n1.crt", node.Cert), Key: write("n1.key", node.Key)}
	st, err := certs.Load(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(ln, st.PeerServerConfig())
	t.Cleanup(func() { tl.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(addr), lockd.WithTLSFiles(files.CA, files.Cert, files.Key), lockd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	start := time.Now()
	err = listLocks(t.Context(), c)
	want := addr + " does not speak the lockd API (is it the Raft port?"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("answered after %v, want about a second", took)
	}
}

// A node over its per-source connection cap resets new connections before
// reading them (internal/server's connCap); that proves nothing about the
// port, so the client must not name it "not the API" for a minute. The
// listener here resets every connection the same way, standing in for a
// node over its cap (a real node needs hundreds of held connections to get
// there).
func TestResetEndpointNotNamedNotAPI(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(ln.Addr().String()), lockd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err = listLocks(ctx, c)
	if err == nil || strings.Contains(err.Error(), "does not speak the lockd API") {
		t.Fatalf("got %v, want a failure that does not name the endpoint as not the API", err)
	}
}

// WithDialer opens every connection of the client's own transports: the
// session stream's upgraded connection and the unary ones. A nil dialer
// is refused.
func TestWithDialer(t *testing.T) {
	if _, err := lockd.New(lockd.WithDialer(nil)); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("New(WithDialer(nil)) = %v, want ErrInvalidArgument", err)
	}
	srv := lockdtest.New(t)
	for _, stream := range []bool{true, false} {
		var dials atomic.Int32
		d := &net.Dialer{}
		c := newClient(t, srv, lockd.WithStream(stream), lockd.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		}))
		s, err := c.NewSession(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		m := s.NewMutex("dialer")
		if err := m.Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if dials.Load() == 0 {
			t.Errorf("stream %v: the dialer opened no connection", stream)
		}
	}
}
