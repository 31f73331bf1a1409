package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes p as dir/name.crt and dir/name.key, replacing them
// atomically (rename), as a certificate manager does.
func writePair(t *testing.T, dir, name string, p PEM) (crt, key string) {
	t.Helper()
	crt, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	for f, b := range map[string][]byte{crt: p.Cert, key: p.Key} {
		if err := os.WriteFile(f+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".tmp", f); err != nil {
			t.Fatal(err)
		}
	}
	return crt, key
}

func mustCA(t *testing.T) PEM {
	t.Helper()
	ca, err := NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca PEM, kind Kind, name string) PEM {
	t.Helper()
	p, err := Issue(ca, kind, name, []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func leafOf(t *testing.T, p PEM) *x509.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}

// TestIssueUsages: node certificates serve and authenticate as clients,
// carry their SANs; client certificates only authenticate as clients; both
// verify against their CA and not against another.
func TestIssueUsages(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	node, client := leafOf(t, mustIssue(t, ca, Node, "n1")), leafOf(t, mustIssue(t, ca, Client, "alice"))
	if node.Subject.CommonName != "n1" || len(node.IPAddresses) != 1 || node.DNSNames[0] != "localhost" {
		t.Fatalf("node cert: cn %q ips %v dns %v", node.Subject.CommonName, node.IPAddresses, node.DNSNames)
	}
	pool := func(p PEM) *x509.CertPool {
		cp := x509.NewCertPool()
		cp.AppendCertsFromPEM(p.Cert)
		return cp
	}
	m := &Material{Roots: pool(ca), ClientRoots: pool(ca)}
	if _, err := m.VerifyMember([]*x509.Certificate{node}); err != nil {
		t.Errorf("node: %v", err)
	}
	if _, err := m.VerifyMember([]*x509.Certificate{client}); !errors.Is(err, ErrNotMember) {
		t.Errorf("client as a member: %v, want ErrNotMember", err)
	}
	for _, c := range []*x509.Certificate{node, client} {
		if _, err := m.VerifyClient([]*x509.Certificate{c}); err != nil {
			t.Errorf("%s as a client: %v", c.Subject.CommonName, err)
		}
	}
	if _, err := node.Verify(x509.VerifyOptions{Roots: pool(ca), DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("node as server: %v", err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool(ca)}); err == nil {
		t.Error("client certificate verified for server authentication")
	}
	foreign := &Material{Roots: pool(other), ClientRoots: pool(other)}
	if _, err := foreign.VerifyMember([]*x509.Certificate{node}); err == nil {
		t.Error("a certificate of another CA verified")
	}
	if _, err := Issue(mustIssue(t, ca, Node, "x"), Node, "y", nil, time.Hour); err == nil {
		t.Error("a node certificate signed another")
	}
}

// TestStoreReloadsChangedFiles: a certificate replaced on disk is what the
// next handshake presents, with no call to Reload; files that do not load
// keep the previous certificate; Reload reports the error.
func TestStoreReloadsChangedFiles(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	first := mustIssue(t, ca, Node, "n1")
	crt, key := writePair(t, dir, "n1", first)
	st, err := Load(Files{CA: caFile, Cert: crt, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := func() *x509.Certificate {
		t.Helper()
		l, err := tls.Listen("tcp", "127.0.0.1:0", st.ServerConfig(ClientAuthNone, nil))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			c, err := l.Accept()
			if err == nil {
				c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := st.DialTLS(ctx, "tcp", l.Addr().String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	if got := served(); !got.Equal(leafOf(t, first)) {
		t.Fatal("first handshake: not the first certificate")
	}
	second := mustIssue(t, ca, Node, "n1")
	writePair(t, dir, "n1", second)
	if got := served(); !got.Equal(leafOf(t, second)) {
		t.Fatal("after the swap: still the old certificate")
	}
	// A key that does not match: the previous pair stays in use.
	if err := os.WriteFile(key, mustIssue(t, ca, Node, "z").Key, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(leafOf(t, second)) {
		t.Fatal("a broken pair replaced the certificate")
	}
	if err := st.Reload(); err == nil {
		t.Fatal("Reload of a broken pair: no error")
	}
}

// TestCheckOwnMember: a node whose own
// certificate is not a member's (a client certificate, here) fails to
// load it, with an error that says so, instead of starting isolated; and a
// reload that swaps one in keeps the node's previous member certificate.
func TestCheckOwnMember(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	crt, key := writePair(t, dir, "app", mustIssue(t, ca, Client, "app"))
	if _, err := Load(Files{CA: caFile, Cert: crt, Key: key, Check: (*Material).CheckOwnMember}, nil); err == nil || !errors.Is(err, ErrNotMember) {
		t.Fatalf("a client certificate as a node's: %v, want ErrNotMember", err)
	}
	node := mustIssue(t, ca, Node, "n1")
	crt, key = writePair(t, dir, "n1", node)
	st, err := Load(Files{CA: caFile, Cert: crt, Key: key, Check: (*Material).CheckOwnMember}, nil)
	if err != nil {
		t.Fatal(err)
	}
	writePair(t, dir, "n1", mustIssue(t, ca, Client, "n1"))
	if err := st.Reload(); !errors.Is(err, ErrNotMember) {
		t.Fatalf("reload of a client certificate: %v, want ErrNotMember", err)
	}
	if got := leafOf(t, PEM{Cert: mustRead(t, crt), Key: mustRead(t, key)}); got.Equal(st.Current().Cert.Leaf) {
		t.Fatal("the non-member certificate replaced the node's")
	}
	if !st.Current().Cert.Leaf.Equal(leafOf(t, node)) {
		t.Fatal("the node's member certificate is no longer in use")
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
