package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// testPKI is a CA in a temp dir and the certificates it issues, as files.
type testPKI struct {
	dir    string
	ca     certs.PEM
	caFile string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := certs.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	if err := os.WriteFile(p.caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes a new certificate and key for name, replacing any earlier
// pair by rename, and returns the file names.
func (p *testPKI) issue(t *testing.T, kind certs.Kind, name string) (crt, key string) {
	t.Helper()
	pair, err := certs.Issue(p.ca, kind, name, []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	for f, b := range map[string][]byte{crt: pair.Cert, key: pair.Key} {
		if err := os.WriteFile(f+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".tmp", f); err != nil {
			t.Fatal(err)
		}
	}
	return crt, key
}

// tlsConfigFor returns a client tls.Config trusting p's CA and presenting
// the given pair (none when crt is empty).
func (p *testPKI) tlsConfigFor(t *testing.T, crt, key string) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.ca.Cert)
	tc := &tls.Config{RootCAs: roots}
	if crt != "" {
		pair, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc
}

// freeAddr returns a loopback address with a port that was free: joining
// nodes need a fixed Raft port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// nodeConfig is a TLS node on loopback with a real Raft transport.
func (p *testPKI) nodeConfig(t *testing.T, name string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = freeAddr(t)
	cfg.NodeID = name
	cfg.HeartbeatTimeout = 300 * time.Millisecond
	cfg.ElectionTimeout = 300 * time.Millisecond
	cfg.ApplyTimeout = 2 * time.Second
	cfg.JoinTimeout = 10 * time.Second
	cfg.TLSCert, cfg.TLSKey = p.issue(t, certs.Node, name)
	cfg.TLSCA = p.caFile
	return cfg
}

func startTLS(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg, WithLogger(testLogger(cfg.NodeID)))
	if err != nil {
		t.Fatalf("start %s: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func waitLeaderOf(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitVoters polls s's Raft configuration until it has n voters.
func waitVoters(t *testing.T, s *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		voters := 0
		if f := s.raft.GetConfiguration(); f.Error() == nil {
			for _, srv := range f.Configuration().Servers {
				if srv.Suffrage == raft.Voter {
					voters++
				}
			}
		}
		if voters == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d voters, want %d", voters, n)
		}
	}
}

// TestTLSClusterFormsForwardsFailsOver: three
// nodes with peer mutual TLS form a cluster by joining over TLS; a client
// that only knows a follower is served through forwarding over TLS (and
// the session stream, HTTP/2 over TLS); when the leader stops, the other
// two elect a new leader over the TLS Raft transport and serve the client.
func TestTLSClusterFormsForwardsFailsOver(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	n1 := startTLS(t, p.nodeConfig(t, "n1"))
	waitLeaderOf(t, n1)
	if !strings.HasPrefix(n1.URL(), "https://") {
		t.Fatalf("url %s: want https", n1.URL())
	}
	nodes := []*Server{n1}
	for _, name := range []string{"n2", "n3"} {
		cfg := p.nodeConfig(t, name)
		cfg.Join = []string{strings.TrimPrefix(n1.URL(), "https://")} // no scheme: https with TLS on
		nodes = append(nodes, startTLS(t, cfg))
	}
	waitVoters(t, n1, 3)

	crt, key := p.issue(t, certs.Client, "alice")
	newClient := func(urls ...string) *lockd.Client {
		cl, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(urls...), lockd.WithTLSFiles(p.caFile, crt, key), lockd.WithRequestTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close(context.Background()) })
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	follower := nodes[1]
	if follower.raft.State() == raft.Leader {
		follower = nodes[2]
	}
	cl := newClient(follower.URL())
	sess, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("session via follower: %v", err)
	}
	if err := sess.NewMutex("a").Lock(ctx); err != nil {
		t.Fatalf("lock via follower: %v", err)
	}
	if n := counterValue(t, follower.api.Hooks().Forwarded()); n == 0 {
		t.Error("the follower forwarded nothing")
	}
	if streamOn() {
		if n := counterValue(t, follower.api.Hooks().StreamFrames().WithLabelValues("acquire")); n == 0 {
			t.Error("no acquire frame on the follower's session stream")
		}
	}

	var leader *Server
	for _, s := range nodes {
		if s.raft.State() == raft.Leader {
			leader = s
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Close()
	var urls []string
	for _, s := range nodes {
		if s != leader {
			urls = append(urls, s.URL())
		}
	}
	cl2 := newClient(urls...)
	s2, err := cl2.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("session after failover: %v", err)
	}
	if err := s2.NewMutex("b").Lock(ctx); err != nil {
		t.Fatalf("lock after failover: %v", err)
	}
	for _, s := range nodes {
		if s != leader && s.raft.State() == raft.Leader {
			return
		}
	}
	t.Error("no new leader among the survivors")
}

// TestTLSForeignNodeRefused: a node whose
// certificate another CA issued cannot join (even trusting the cluster's
// CA), cannot send a vote request to a member, and cannot forward; a
// client certificate of the cluster CA is not a member's either. A member's
// certificate on the same paths is answered (the control).
func TestTLSForeignNodeRefused(t *testing.T) {
	leakCheck(t)
	p, other := newTestPKI(t), newTestPKI(t)
	n1 := startTLS(t, p.nodeConfig(t, "n1"))
	waitLeaderOf(t, n1)
	rogueCrt, rogueKey := other.issue(t, certs.Node, "rogue")

	t.Run("join", func(t *testing.T) {
		cfg := p.nodeConfig(t, "rogue")
		cfg.TLSCert, cfg.TLSKey = rogueCrt, rogueKey // trusts our CA, has another's certificate
		cfg.Join = []string{n1.URL()}
		// Such a node now refuses to start (its own certificate is not a
		// member's); a joiner that skips that check is refused by the
		// member (TestTLSPeerCallsNeedMember).
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Fatal("a node with another CA's certificate joined")
		} else if !strings.Contains(err.Error(), "only cluster members") && !errors.Is(err, certs.ErrNotMember) {
			t.Fatalf("join: %v", err)
		}
		cfg = other.nodeConfig(t, "rogue2") // another CA altogether
		cfg.Join = []string{n1.URL()}
		cfg.JoinTimeout = time.Second
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Fatal("a node of another CA joined")
		}
		if f := n1.raft.GetConfiguration(); f.Error() != nil || len(f.Configuration().Servers) != 1 {
			t.Fatalf("configuration changed: %+v", f.Configuration())
		}
	})

	t.Run("vote", func(t *testing.T) {
		transport := func(crt, key, ca string) *raft.NetworkTransport {
			t.Helper()
			st, err := certs.Load(certs.Files{CA: ca, Cert: crt, Key: key}, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.RaftListen = "127.0.0.1:0"
			tr, err := node.OpenTLSTransport(cfg, st, nil, hclog.NewNullLogger(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.(*raft.NetworkTransport).Close() })
			return tr.(*raft.NetworkTransport)
		}
		term := n1.raft.CurrentTerm()
		vote := func(tr *raft.NetworkTransport, term uint64) error {
			req := &raft.RequestVoteRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("rogue"), Addr: []byte(tr.LocalAddr())},
				Term:      term, LastLogIndex: 1 << 40, LastLogTerm: term,
			}
			var resp raft.RequestVoteResponse
			return tr.RequestVote("n1", raft.ServerAddress(n1.RaftAddr()), req, &resp)
		}
		rogue := transport(rogueCrt, rogueKey, p.caFile)
		if err := vote(rogue, term+100); err == nil {
			t.Fatal("a vote request with another CA's certificate was answered")
		}
		if got := n1.raft.CurrentTerm(); got != term || n1.raft.State() != raft.Leader {
			t.Fatalf("term %d → %d, state %v: the leader heard the vote request", term, got, n1.raft.State())
		}
		goodCrt, goodKey := p.issue(t, certs.Node, "n9")
		if err := vote(transport(goodCrt, goodKey, p.caFile), 0); err != nil {
			t.Fatalf("control: a member's stale vote request: %v", err)
		}
		// The other way: a member does not talk to a node of another CA.
		foreign := transport(rogueCrt, rogueKey, other.caFile)
		var resp raft.AppendEntriesResponse
		err := transport(goodCrt, goodKey, p.caFile).AppendEntries("rogue", foreign.LocalAddr(), &raft.AppendEntriesRequest{Term: term}, &resp)
		if err == nil {
			t.Fatal("a member sent entries to a node of another CA")
		}
	})

	t.Run("forward", func(t *testing.T) {
		// Two calls on one connection: the second is answered from the
		// per-connection cache of the peer check, the same way.
		status := func(tc *tls.Config) error {
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
			defer hc.CloseIdleConnections()
			var errs [2]error
			for i := range errs {
				req := connect.NewRequest(&lockdv1.StatusRequest{})
				req.Header().Set(ForwardedHeader, "n9")
				_, errs[i] = lockdv1connect.NewLockServiceClient(hc, n1.URL()).Status(context.Background(), req)
			}
			if connect.CodeOf(errs[0]) != connect.CodeOf(errs[1]) {
				t.Errorf("first call %v, second %v", errs[0], errs[1])
			}
			return errs[1]
		}
		aliceCrt, aliceKey := p.issue(t, certs.Client, "alice")
		for name, tc := range map[string]*tls.Config{
			"another CA's node":  p.tlsConfigFor(t, rogueCrt, rogueKey),
			"a client of our CA": p.tlsConfigFor(t, aliceCrt, aliceKey),
			"no certificate":     p.tlsConfigFor(t, "", ""),
		} {
			if err := status(tc); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("%s: forwarded call: %v, want permission denied", name, err)
			}
		}
		goodCrt, goodKey := p.issue(t, certs.Node, "n9")
		if err := status(p.tlsConfigFor(t, goodCrt, goodKey)); err != nil {
			t.Errorf("control: a member's forwarded call: %v", err)
		}
	})
}

// TestTLSClientAuth: with client auth required, a
// client certificate of an unknown CA, or none, is refused and ours is
// served; verify-if-given serves clients without one but refuses an
// unknown CA's; none serves everybody.
func TestTLSClientAuth(t *testing.T) {
	leakCheck(t)
	p, other := newTestPKI(t), newTestPKI(t)
	aliceCrt, aliceKey := p.issue(t, certs.Client, "alice")
	eveCrt, eveKey := other.issue(t, certs.Client, "eve")
	clients := map[string]*tls.Config{
		"ours":    p.tlsConfigFor(t, aliceCrt, aliceKey),
		"unknown": p.tlsConfigFor(t, eveCrt, eveKey),
		"none":    p.tlsConfigFor(t, "", ""),
	}
	for _, tc := range []struct {
		mode   string
		served []string
	}{
		{"require", []string{"ours"}},
		{"verify-if-given", []string{"ours", "none"}},
		{"none", []string{"ours", "none", "unknown"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := p.nodeConfig(t, "n1")
			cfg.TLSClientAuth = tc.mode
			s := startTLS(t, cfg)
			for name, c := range clients {
				hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
				resp, err := hc.Get(s.URL() + "/healthz")
				if err == nil {
					resp.Body.Close()
				}
				hc.CloseIdleConnections()
				want := false
				for _, n := range tc.served {
					want = want || n == name
				}
				if got := err == nil; got != want {
					t.Errorf("client %s: served %v, want %v (err %v)", name, got, want, err)
				}
			}
		})
	}
}

// TestTLSGoClient: a Go client given a tls.Config (WithTLSConfig) takes a
// lock over TLS, on the session stream (HTTP/2 over TLS) unless streams
// are off; a client without a certificate, where one is required, fails
// at once with ErrUnavailable and the TLS cause instead of retrying.
func TestTLSGoClient(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	cfg := p.nodeConfig(t, "n1")
	cfg.TLSClientAuth = "require"
	n1 := startTLS(t, cfg)
	waitLeaderOf(t, n1)
	host := strings.TrimPrefix(n1.URL(), "https://")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	crt, key := p.issue(t, certs.Client, "alice")
	cl, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(host), lockd.WithTLSConfig(p.tlsConfigFor(t, crt, key)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	sess, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.NewMutex("a").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if streamOn() && counterValue(t, n1.api.Hooks().StreamFrames().WithLabelValues("acquire")) == 0 {
		t.Error("no acquire frame on a session stream over TLS")
	}

	anon, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(host), lockd.WithTLSConfig(p.tlsConfigFor(t, "", "")))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close(context.Background())
	start := time.Now()
	_, err = anon.NewSession(ctx)
	if !errors.Is(err, lockd.ErrUnavailable) || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("no client certificate: %v, want unavailable with the tls cause", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the refused handshake was retried for %v", time.Since(start))
	}
}

// TestTLSCertSwappedOnDisk: a node certificate
// replaced on disk is presented by the next new API and Raft connection,
// with no restart and no signal.
func TestTLSCertSwappedOnDisk(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	n1 := startTLS(t, p.nodeConfig(t, "n1"))
	memberCrt, memberKey := p.issue(t, certs.Node, "n9")
	tc := p.tlsConfigFor(t, memberCrt, memberKey)
	served := func(addr, proto string) *x509.Certificate {
		t.Helper()
		c := tc.Clone()
		c.NextProtos = []string{proto}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	api := strings.TrimPrefix(n1.URL(), "https://")
	before, beforeRaft := served(api, "h2"), served(n1.RaftAddr(), certs.PeerProto)
	if !before.Equal(beforeRaft) {
		t.Fatal("api and raft serve different certificates")
	}
	p.issue(t, certs.Node, "n1") // the renewal
	after, afterRaft := served(api, "h2"), served(n1.RaftAddr(), certs.PeerProto)
	if after.Equal(before) || afterRaft.Equal(before) {
		t.Fatal("the old certificate is still served after the swap")
	}
	if !after.Equal(afterRaft) {
		t.Fatal("api and raft serve different certificates after the swap")
	}
	if err := n1.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
}

// TestTLSIdentity: the hook for authentication names a verified client
// certificate's subject, tells a member's certificate from a client's, and
// names nobody for an unknown CA's certificate or none.
func TestTLSIdentity(t *testing.T) {
	leakCheck(t)
	p, other := newTestPKI(t), newTestPKI(t)
	n1 := startTLS(t, p.nodeConfig(t, "n1"))
	leaf := func(crt, key string) []*x509.Certificate {
		pair, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{pair.Leaf}
	}
	id, ok := n1.TLSIdentity(&tls.ConnectionState{PeerCertificates: leaf(p.issue(t, certs.Client, "alice"))})
	if !ok || id.Name != "alice" || id.Peer {
		t.Errorf("alice: %+v %v", id, ok)
	}
	id, ok = n1.TLSIdentity(&tls.ConnectionState{PeerCertificates: leaf(p.issue(t, certs.Node, "n2"))})
	if !ok || id.Name != "n2" || !id.Peer || len(id.DNSNames) != 1 {
		t.Errorf("n2: %+v %v", id, ok)
	}
	if id, ok := n1.TLSIdentity(&tls.ConnectionState{PeerCertificates: leaf(other.issue(t, certs.Client, "eve"))}); ok {
		t.Errorf("eve of another CA: %+v", id)
	}
	if _, ok := n1.TLSIdentity(&tls.ConnectionState{}); ok {
		t.Error("no certificate: an identity")
	}
	if _, ok := n1.TLSIdentity(nil); ok {
		t.Error("plaintext: an identity")
	}
}

// TestPlaintextNonLoopbackRefused: a node refuses to listen
// without TLS on an address other machines can reach, unless Insecure;
// loopback with no TLS settings stays valid, as the quick start needs.
func TestPlaintextNonLoopbackRefused(t *testing.T) {
	base := DefaultConfig()
	if err := base.Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		wants string // "" when valid
	}{
		{"wildcard api", func(c *Config) { c.Listen, c.Advertise = "0.0.0.0:7070", "http://10.0.0.1:7070" }, "listen \"0.0.0.0:7070\" is not a loopback address"},
		{"lan raft", func(c *Config) { c.RaftListen = "10.0.0.1:7071" }, "raft-listen \"10.0.0.1:7071\" is not a loopback address"},
		{"empty host", func(c *Config) { c.Listen, c.Advertise = ":7070", "http://10.0.0.1:7070" }, "not a loopback address"},
		{"insecure", func(c *Config) { c.Listen, c.Advertise, c.Insecure = "0.0.0.0:7070", "http://10.0.0.1:7070", true }, ""},
		{"tls", func(c *Config) {
			c.Listen, c.Advertise = "0.0.0.0:7070", "https://10.0.0.1:7070"
			c.TLSCert, c.TLSKey, c.TLSCA = "n.crt", "n.key", "ca.crt"
		}, ""},
		{"tls with an http advertise", func(c *Config) {
			c.Advertise = "http://127.0.0.1:7070"
			c.TLSCert, c.TLSKey, c.TLSCA = "n.crt", "n.key", "ca.crt"
		}, "an http:// URL with tls on"},
		{"localhost", func(c *Config) { c.Listen = "localhost:7070" }, ""},
		{"ipv6 loopback", func(c *Config) { c.Listen = "[::1]:7070" }, ""},
		{"tls half", func(c *Config) { c.TLSCert = "n.crt" }, "--tls-cert, --tls-key and --tls-ca together"},
		{"client auth without tls", func(c *Config) { c.TLSClientAuth = "require" }, "need tls on"},
		{"bad client auth", func(c *Config) { c.TLSCert, c.TLSKey, c.TLSCA, c.TLSClientAuth = "a", "b", "c", "always" }, "want none, verify-if-given or require"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wants == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wants != "" && (err == nil || !strings.Contains(err.Error(), tc.wants)):
				t.Fatalf("got %v, want an error with %q", err, tc.wants)
			}
		})
	}
}

// TestTLSCertificateIdentity: with an auth file, a client that sends no
// token is known by its certificate's common name, and the grants of that
// identity apply; a certificate from another CA gives no identity.
func TestTLSCertificateIdentity(t *testing.T) {
	leakCheck(t)
	p, other := newTestPKI(t), newTestPKI(t)
	aliceCrt, aliceKey := p.issue(t, certs.Client, "alice")
	eveCrt, eveKey := other.issue(t, certs.Client, "alice")
	authFile := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(authFile, []byte("grant alice lock billing/\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := p.nodeConfig(t, "n1")
	cfg.TLSClientAuth = "verify-if-given"
	cfg.AuthFile = authFile
	s := startTLS(t, cfg)
	waitLeaderOf(t, s)
	acquire := func(c *tls.Config, name string) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
		defer hc.CloseIdleConnections()
		lc := lockdv1connect.NewLockServiceClient(hc, s.URL())
		ctx := t.Context()
		sess, err := lc.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			return err
		}
		_, err = lc.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sess.Msg.SessionId, Secret: sess.Msg.Secret, Seq: 1, Name: name}))
		return err
	}
	alice := p.tlsConfigFor(t, aliceCrt, aliceKey)
	if err := acquire(alice, "billing/x"); err != nil {
		t.Errorf("alice (certificate) acquires billing/x: %v", err)
	}
	if err := acquire(alice, "payments/x"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("alice acquires payments/x: %v, want PermissionDenied", err)
	}
	if err := acquire(p.tlsConfigFor(t, "", ""), "billing/x"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no certificate, no token: %v, want Unauthenticated", err)
	}
	// "alice" from another CA: the handshake is refused (verify-if-given
	// checks a given certificate), so no identity either way.
	if err := acquire(p.tlsConfigFor(t, eveCrt, eveKey), "billing/x"); err == nil {
		t.Error("a certificate named alice from another CA was served")
	}
}

// The session stream's upgrade over TLS: a client offering ALPN http/1.1
// with its certificate gets the 101 and the stream's open frame on the
// same TLS connection.
func TestTLSStreamUpgrade(t *testing.T) {
	p := newTestPKI(t)
	cfg := p.nodeConfig(t, "n1")
	cfg.TLSClientAuth = "require"
	n1 := startTLS(t, cfg)
	waitLeaderOf(t, n1)
	host := strings.TrimPrefix(n1.URL(), "https://")
	crt, key := p.issue(t, certs.Client, "alice")
	tc := p.tlsConfigFor(t, crt, key)
	tc.NextProtos = []string{"http/1.1"}
	tc.ServerName = "127.0.0.1"
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", host, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "POST " + lockdv1connect.SessionServiceStreamProcedure + " HTTP/1.1\r\nHost: " + host +
		"\r\nContent-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\nConnection: Upgrade\r\nUpgrade: lockd-stream\r\nContent-Length: 0\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("answer %s, want 101", resp.Status)
	}
	var prefix [5]byte
	if _, err := io.ReadFull(br, prefix[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	open := new(lockdv1.StreamResponse)
	if prefix[0] != 0 || proto.Unmarshal(body, open) != nil || open.GetClusterId() == "" {
		t.Fatalf("first frame (flags %#x) %q, want the open frame", prefix[0], body)
	}
}
