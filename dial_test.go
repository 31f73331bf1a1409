package lockd_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd"
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

// Issue 17, item 13: with nothing listening, a client with a connect
// timeout (the CLI's 5 s) answers within about a second, with an error that
// matches ErrUnavailable and wraps the refusal (errors.Is ECONNREFUSED), for
// a call and for a new session.
func TestRefusedAnswersFast(t *testing.T) {
	addrs := []string{closedPort(t), closedPort(t)}
	for _, eps := range [][]string{addrs[:1], addrs} {
		c, err := lockd.New(lockd.WithEndpoints(eps...), lockd.WithConnectTimeout(5*time.Second))
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
		c, err := lockd.New(lockd.WithEndpoints(closedPort(t), srv.URL()), lockd.WithConnectTimeout(5*time.Second))
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

// Issue 17, item 13: a client pointed at a Raft port (hashicorp/raft's
// transport, which hangs up on anything else) says so within about a
// second, for a call and for a new session (over the session stream), and
// does not retry it; beside a live endpoint, the Raft port is passed over.
func TestRaftPortNamed(t *testing.T) {
	addr := raftPort(t)
	c, err := lockd.New(lockd.WithEndpoints(addr), lockd.WithConnectTimeout(5*time.Second))
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
	c2, err := lockd.New(lockd.WithEndpoints(raftPort(t), srv.URL()))
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
