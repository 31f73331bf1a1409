package server

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/sockettest"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// clientFrom returns an HTTP/1.1 client whose connections come from the
// local address ip (Linux routes all of 127/8 to loopback).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// listFrom makes a ListLocks call to s from the local address ip.
func listFrom(ctx context.Context, s *Server, ip string) error {
	_, err := lockdv1connect.NewLockServiceClient(clientFrom(ip), "http://"+s.Addr().String()).
		ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{}))
	return err
}

// TestConnCapPerSource: the connections of one source address beyond
// --max-conns-per-source are closed at once (without the cap such a
// connection sits open until the 10 s header timeout), counted in
// lockd_limit_hits_total{reason="conns"}; another source is served
// meanwhile; every slot is freed when its connection closes, round after
// round (no leak).
func TestConnCapPerSource(t *testing.T) {
	const max = 3
	s := startHostNode(t, func(c *Config) { c.MaxConnsPerSource = max })
	one := netip.MustParseAddr("127.0.0.1")
	for round := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		waitFreed(t, s, one) // the last round's call, closed by the client, may not be closed here yet
		var held []net.Conn
		for range max {
			c, err := net.Dial("tcp", s.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("GET / HTTP/1.1\r\n")) // a partial header: a slow client
			held = append(held, c)
		}
		// The node counts a connection once it accepted it.
		for deadline := time.Now().Add(10 * time.Second); s.guard.OpenConns(one) < max; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d connections counted, want %d", round, s.guard.OpenConns(one), max)
			}
			time.Sleep(5 * time.Millisecond) // real sockets: polled with a deadline
		}
		if err := sockettest.ClosedAtOnce("127.0.0.1", s.Addr().String()); err != nil {
			t.Errorf("round %d: a connection over the cap: %v", round, err)
		}
		if err := listFrom(ctx, s, "127.0.0.2"); err != nil {
			t.Errorf("round %d: another source while 127.0.0.1 is at its cap: %v", round, err)
		}
		for _, c := range held {
			c.Close()
		}
		waitFreed(t, s, one)
		if err := listFrom(ctx, s, "127.0.0.1"); err != nil {
			t.Errorf("round %d: 127.0.0.1 after its connections closed: %v", round, err)
		}
		cancel()
	}
	if got := testutil.ToFloat64(s.api.LimitHits().WithLabelValues("conns")); got != 3 {
		t.Errorf("lockd_limit_hits_total{reason=conns} = %v, want 3", got)
	}
}

// waitFreed waits until the node counts no connection from ip: a slot is
// freed when the node closes its end, a moment after the client's.
func waitFreed(t *testing.T, s *Server, ip netip.Addr) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.guard.OpenConns(ip) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots of %s still taken after every connection closed", s.guard.OpenConns(ip), ip)
		}
		time.Sleep(5 * time.Millisecond) // real sockets: polled with a deadline
	}
}
