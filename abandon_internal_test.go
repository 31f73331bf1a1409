package lockd

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// An overdue keepalive abandons a node only when nothing at all came from
// it during the attempt. The attempt below stands for a keepalive that a
// slow (not frozen) node answers late: it waits out its whole timeout, a
// fault a real node cannot produce on cue. When another answer comes from
// the node meanwhile (here GET /healthz on the client's own transport, as
// another call's answer or an HTTP/2 ping reply would), the node is kept;
// when nothing comes, it is abandoned as before.
func TestOverdueKeepaliveKeepsNodeThatSends(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := "stream"
		if !stream {
			name = "unary"
		}
		t.Run(name, func(t *testing.T) {
			srv := lockdtest.New(t)
			c, err := New(WithEndpoints(srv.URL()), WithStream(stream))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close(context.Background()) })
			p := wire.Policy{Idempotent: true, Once: true, Abandon: true, Timeout: 300 * time.Millisecond}
			abandoned := func() bool { return c.eps.AbandonedLately(c.eps.All()[0]) }
			overdue := func(ctx context.Context, ep *wire.Node) error {
				<-ctx.Done()
				return ctx.Err()
			}
			// Answers arrive during the attempt: kept.
			err = c.call.Do(t.Context(), p, "", func(ctx context.Context, ep *wire.Node) error {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL+"/healthz", nil)
				if err != nil {
					return err
				}
				resp, err := c.cfg.httpClient.Do(req)
				if err != nil {
					t.Errorf("healthz: %v", err)
					return err
				}
				resp.Body.Close()
				return overdue(ctx, ep)
			})
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("overdue attempt = %v, want ErrUnavailable", err)
			}
			if abandoned() {
				t.Fatal("a node that answered during the overdue attempt was abandoned")
			}
			// Nothing arrives during the attempt: abandoned.
			if err := c.call.Do(t.Context(), p, "", overdue); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("overdue attempt = %v, want ErrUnavailable", err)
			}
			if !abandoned() {
				t.Fatal("a node that sent nothing during the overdue attempt was kept")
			}
		})
	}
}

// With WithTLSFiles the client's transports get the *tls.Conn from their
// TLS dial (the connection tracker sits beneath TLS): the stream's
// transport speaks HTTP/2 chosen by ALPN with the response's TLS state
// set, the unary one HTTP/1.1 over TLS, and both connections are still
// tracked (closed on abandon, their reads stamped).
func TestTLSFilesTransportsSeeTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := certs.Issue(ca, certs.Node, "n1", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.Cert, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(node.Cert, node.Key)
	if err != nil {
		t.Fatal(err)
	}
	// A real HTTPS server (net/http, HTTP/2 by ALPN) stands for a node:
	// what is checked is the client's transports.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}}}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { hs.Close() })
	url := "https://" + ln.Addr().String()
	c, err := New(WithEndpoints(url), WithTLSFiles(caFile, "", ""), WithStream(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	for _, tc := range []struct {
		name  string
		hc    *http.Client
		proto int
		alpn  string
	}{{"stream transport", c.cfg.httpClient, 2, "h2"}, {"unary transport", c.h1, 1, "http/1.1"}} {
		since := wire.MonoNow()
		resp, err := tc.hc.Get(url + "/healthz")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.TLS == nil || resp.ProtoMajor != tc.proto || resp.TLS.NegotiatedProtocol != tc.alpn {
			t.Errorf("%s: proto %s, TLS state %v; want HTTP/%d with TLS, ALPN %q", tc.name, resp.Proto, resp.TLS != nil, tc.proto, tc.alpn)
		}
		if !c.conns.HeardSince(wire.DialAddr(url), since) {
			t.Errorf("%s: the answer's bytes were not stamped", tc.name)
		}
	}
	if n := c.conns.CloseAddr(wire.DialAddr(url)); n != 2 {
		t.Errorf("closed %d tracked connections, want 2 (one per transport)", n)
	}
}

// wire.ConnLost matches the bundled http2's unexported errClientConnLost by its
// message (net/http offers no sentinel). This pins the message against a
// real HTTP/2 connection whose pings go unanswered (a listener that
// accepts and never reads nor writes, as a SIGSTOPped node's kernel
// does), so a Go upgrade that changes it fails here, loudly.
func TestConnLostMatchesPingTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, conn := range held {
			conn.Close()
		}
	})
	h2, _ := wire.NewTransports()
	defer h2.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // generous: wire.PingAfter + wire.PingTimeout is expected
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&http.Client{Transport: h2}).Do(req)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("request to a silent HTTP/2 peer = %v (ctx %v), want the pings' lost connection", err, ctx.Err())
	}
	if !wire.ConnLost(err) {
		t.Fatalf("wire.ConnLost(%q) = false: the http2 message for a connection its pings found dead changed (abandon.go matches %q)", err, "http2: client connection lost")
	}
}

// A stream to a node this client never heard from, while another node
// answers it, opens within reopenTimeout, not the request timeout: a call
// moved there after a failure elsewhere may meet the frozen leader the
// failure came from, whose hello never comes (in TestClusterLeaderPause a
// Release waited 2 s there, until the pings gave up). Before any node
// answered (a cold start on a busy machine) the request timeout holds.
func TestOpenTimeoutForUnheardNode(t *testing.T) {
	srv := lockdtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // never spoken to below
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := New(WithStream(lockdtest.Stream()), WithEndpoints(srv.URL(), "http://"+ln.Addr().String()), WithRequestTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	eps := c.eps.All()
	live, unheard := eps[0], eps[1]
	if got := c.eps.OpenTimeout(unheard, 30*time.Second); got != 30*time.Second {
		t.Fatalf("before any answer: open timeout %v, want the request timeout", got)
	}
	c.eps.SetCurrent(0)
	if _, err := c.Service().DescribeLock(t.Context(), connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "x"})); err != nil {
		t.Fatal(err)
	}
	if got := c.eps.OpenTimeout(unheard, 30*time.Second); got != time.Second {
		t.Errorf("node never heard from while another answers: open timeout %v, want %v (reopenTimeout)", got, time.Second)
	}
	if got := c.eps.OpenTimeout(live, 30*time.Second); got != 30*time.Second {
		t.Errorf("node that answered: open timeout %v, want the request timeout", got)
	}
}
