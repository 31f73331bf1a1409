package server

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/node"
	"github.com/lockd-dev/lockd/internal/sockettest"

	"connectrpc.com/connect"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/certs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// issueUsages writes a certificate of p's CA for name with exactly the
// given extended key usages (none: no extension, which Go and many CAs
// read as any usage), as `lockd cert` cannot make it, and returns the
// file names.
func (p *testPKI) issueUsages(t *testing.T, name string, ekus ...x509.ExtKeyUsage) (crt, key string) {
	t.Helper()
	ca, err := tls.X509KeyPair(p.ca.Cert, p.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh key: reuse a node certificate's, which is a valid PEM key.
	pair, err := certs.Issue(p.ca, certs.Client, name, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  ekus,
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, kp.PrivateKey.(crypto.Signer).Public(), ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	crt, key = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pair.Key, 0o600); err != nil {
		t.Fatal(err)
	}
	return crt, key
}

// raftTransport is hashicorp/raft's own NetworkTransport over the Raft
// port's TLS, presenting crt.
func (p *testPKI) raftTransport(t *testing.T, crt, key string) *raft.NetworkTransport {
	t.Helper()
	st, err := certs.Load(certs.Files{CA: p.caFile, Cert: crt, Key: key}, nil)
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

// twoTLSNodes starts a TLS cluster of two: n1 the leader, n2 joined.
func twoTLSNodes(t *testing.T, p *testPKI, opts2 ...Option) (n1, n2 *Server) {
	t.Helper()
	n1 = startTLS(t, p.nodeConfig(t, "n1"))
	waitLeaderOf(t, n1)
	cfg := p.nodeConfig(t, "n2")
	cfg.Join = []string{n1.URL()}
	n2, err := New(cfg, append([]Option{WithLogger(testLogger("n2"))}, opts2...)...)
	if err != nil {
		t.Fatalf("start n2: %v", err)
	}
	t.Cleanup(func() { n2.Close() })
	waitVoters(t, n1, 2)
	return n1, n2
}

// replicates takes a lock through the cluster's leader and waits until
// every node has applied the leader's last entry.
func replicates(t *testing.T, p *testPKI, name string, nodes ...*Server) {
	t.Helper()
	crt, key := p.issue(t, certs.Client, "app")
	var urls []string
	for _, s := range nodes {
		urls = append(urls, s.URL())
	}
	cl, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(urls...), lockd.WithTLSFiles(p.caFile, crt, key))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	if err := sess.NewMutex(name).Lock(ctx); err != nil {
		t.Fatalf("lock %s: %v", name, err)
	}
	var want uint64
	for _, s := range nodes {
		if s.raft.State() == raft.Leader {
			want = s.raft.LastIndex()
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		caught := true
		for _, s := range nodes {
			caught = caught && s.raft.AppliedIndex() >= want
		}
		if caught {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index %d not applied on every node", want)
		}
	}
}

// TestRaftPortMembersOnly: on a node's Raft port, the
// TLS handshake itself fails for a client certificate of the cluster CA
// (`lockd cert client`) and for one without extended key usages, so
// hashicorp/raft's own transport presenting one cannot append entries or
// move the term; a member's (`lockd cert node`) is answered, and a TLS
// cluster of two forms and replicates.
func TestRaftPortMembersOnly(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	n1, n2 := twoTLSNodes(t, p)
	replicates(t, p, "a", n1, n2)

	appCrt, appKey := p.issue(t, certs.Client, "app")
	bareCrt, bareKey := p.issueUsages(t, "bare") // no extended key usage
	for name, pair := range map[string][2]string{"client": {appCrt, appKey}, "no usages": {bareCrt, bareKey}} {
		t.Run(name, func(t *testing.T) {
			// hashicorp/raft's transport, as the leader of a higher term.
			term := n1.raft.CurrentTerm()
			last := n1.raft.LastIndex()
			tr := p.raftTransport(t, pair[0], pair[1])
			req := &raft.AppendEntriesRequest{
				RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("rogue"), Addr: []byte(tr.LocalAddr())},
				Term:         term + 100,
				PrevLogEntry: last, PrevLogTerm: term,
				Entries:           []*raft.Log{{Index: last + 1, Term: term + 100, Type: raft.LogCommand, Data: []byte{0xff}}},
				LeaderCommitIndex: last + 1,
			}
			var resp raft.AppendEntriesResponse
			if err := tr.AppendEntries("n1", raft.ServerAddress(n1.RaftAddr()), req, &resp); err == nil {
				t.Errorf("append entries with a %s certificate answered: %+v", name, resp)
			}
			if got := n1.raft.CurrentTerm(); got != term {
				t.Errorf("term %d → %d: the node heard the append", term, got)
			}

			// The handshake: with TLS 1.3 the client's side ends before
			// the server has checked its certificate, so the refusal is
			// the alert read next. Today's main served it, and the read
			// waited for an RPC.
			tc := p.tlsConfigFor(t, pair[0], pair[1])
			tc.NextProtos = []string{certs.PeerProto}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n1.RaftAddr(), tc)
			if err == nil {
				c.SetReadDeadline(time.Now().Add(node.RaftHandshakeTimeout))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			var ne net.Error
			if err == nil || errors.As(err, &ne) && ne.Timeout() || !strings.Contains(err.Error(), "bad certificate") {
				t.Fatalf("handshake on the raft port: %v, want a bad certificate alert", err)
			}
		})
	}

	// The control: a member's (stale) append is answered.
	goodCrt, goodKey := p.issue(t, certs.Node, "n9")
	var resp raft.AppendEntriesResponse
	err := p.raftTransport(t, goodCrt, goodKey).AppendEntries("n1", raft.ServerAddress(n1.RaftAddr()), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n9")},
	}, &resp)
	if err != nil || resp.Success {
		t.Fatalf("control: a member's stale append: %v %+v", err, resp)
	}
	replicates(t, p, "b", n1, n2)
}

// TestRaftPortIdleFlood: 300 idle TCP connections from
// 127.0.0.1 to a TLS node's Raft port (no certificate, no byte sent) are
// all closed within the handshake deadline; meanwhile the node replicates,
// its heap stays bounded (today's main gave each a 256 KiB buffer and kept
// it open for ever), and the refusals cost a few log lines, not 300.
func TestRaftPortIdleFlood(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	var refusedLines atomic.Int64
	n1, n2 := twoTLSNodes(t, p, WithLogger(slog.New(countingHandler{"raft port: refused", &refusedLines})))
	if n2.raft.State() == raft.Leader {
		n1, n2 = n2, n1 // flood the follower, whose accepted connections carry the entries
	}
	replicates(t, p, "warm-up", n1, n2)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const flood = 300
	start := time.Now()
	var conns []net.Conn
	for range flood {
		c, err := net.DialTimeout("tcp", n2.RaftAddr(), 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	replicates(t, p, "during-flood", n1, n2)
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	const bound = 32 << 20 // 300 × 256 KiB is 75 MiB
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > bound {
		t.Errorf("heap grew by %d MiB with %d idle connections, want under %d MiB", grew>>20, flood, bound>>20)
	}

	deadline := start.Add(node.RaftHandshakeTimeout + 5*time.Second) // generous: a busy machine
	var wg sync.WaitGroup
	var open atomic.Int64
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(deadline)
			if _, err := io.ReadAll(c); sockettest.IsTimeout(err) {
				open.Add(1)
			}
		})
	}
	wg.Wait()
	if n := open.Load(); n > 0 {
		t.Fatalf("%d of %d idle connections still open %v after they were made", n, flood, deadline.Sub(start))
	}
	if n := refusedLines.Load(); n < 1 || n > 3 {
		t.Errorf("%d log lines about refused connections, want 1 to 3", n)
	}
	replicates(t, p, "after-flood", n1, n2)
}

// TestTLSPeerCallsNeedMember: on the API, a join or a
// forwarded call is refused for a client certificate of the cluster CA and
// for one without extended key usages (today's main took the latter for a
// member's), and served for a node certificate.
func TestTLSPeerCallsNeedMember(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	n1 := startTLS(t, p.nodeConfig(t, "n1"))
	waitLeaderOf(t, n1)
	call := func(tc *tls.Config, join bool) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		defer hc.CloseIdleConnections()
		if join {
			_, err := lockdv1connect.NewClusterServiceClient(hc, n1.URL()).Join(context.Background(), connect.NewRequest(&lockdv1.JoinRequest{
				NodeId: "rogue", RaftAddress: "127.0.0.1:1", ApiUrl: "https://127.0.0.1:1",
			}))
			return err
		}
		req := connect.NewRequest(&lockdv1.StatusRequest{})
		req.Header().Set(ForwardedHeader, "n9")
		_, err := lockdv1connect.NewLockServiceClient(hc, n1.URL()).Status(context.Background(), req)
		return err
	}
	appCrt, appKey := p.issue(t, certs.Client, "app")
	bareCrt, bareKey := p.issueUsages(t, "bare")
	srvCrt, srvKey := p.issueUsages(t, "web", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageAny)
	for name, tc := range map[string]*tls.Config{
		"client":             p.tlsConfigFor(t, appCrt, appKey),
		"no usages":          p.tlsConfigFor(t, bareCrt, bareKey),
		"server and any use": p.tlsConfigFor(t, srvCrt, srvKey),
	} {
		for _, join := range []bool{true, false} {
			if err := call(tc, join); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("%s (join %v): %v, want permission denied", name, join, err)
			}
		}
	}
	if f := n1.raft.GetConfiguration(); f.Error() != nil || len(f.Configuration().Servers) != 1 {
		t.Fatalf("configuration changed: %+v", f.Configuration())
	}
	goodCrt, goodKey := p.issue(t, certs.Node, "n9")
	if err := call(p.tlsConfigFor(t, goodCrt, goodKey), false); err != nil {
		t.Errorf("control: a member's forwarded call: %v", err)
	}
}

// countingHandler counts the log records whose message starts with prefix.
type countingHandler struct {
	prefix string
	n      *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }
