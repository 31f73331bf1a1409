package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"testing"
	"time"
)

// signer is a certificate and its key, to sign others with.
type signer struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func signerOf(t *testing.T, p PEM) signer {
	t.Helper()
	pair, err := tls.X509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return signer{pair.Leaf, pair.PrivateKey.(crypto.Signer)}
}

// sign makes a certificate named name with the given extended key usages
// (none: no extension), signed by parent; isCA makes an intermediate CA.
func sign(t *testing.T, parent signer, name string, isCA bool, ekus ...x509.ExtKeyUsage) signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
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
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent.cert, &key.PublicKey, parent.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return signer{c, key}
}

// rootCA makes a self-signed CA that allows intermediates.
func rootCA(t *testing.T) signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "root"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return signer{c, key}
}

// TestVerifyMember: a member is a certificate of the
// cluster CA whose extended key usages name both server and client
// authentication. A client certificate, a certificate without extended
// key usages, one with only one of the two, or with only
// anyExtendedKeyUsage is not; nor is a node certificate under an
// intermediate CA restricted to client authentication, nor one from the
// client CA or another CA.
func TestVerifyMember(t *testing.T) {
	caPEM, otherPEM := mustCA(t), mustCA(t)
	ca, other := signerOf(t, caPEM), signerOf(t, otherPEM)
	pool := func(ss ...signer) *x509.CertPool {
		p := x509.NewCertPool()
		for _, s := range ss {
			p.AddCert(s.cert)
		}
		return p
	}
	// The client CA (--tls-client-ca) is another: its certificates are
	// clients', whatever their usages.
	m := &Material{Roots: pool(ca), ClientRoots: pool(other)}
	srv, cli, anyU := x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageAny
	// lockd cert's CA allows no intermediates: a root of another PKI that
	// does, trusted too.
	root := rootCA(t)
	m.Roots.AddCert(root.cert)
	clientOnlyCA := sign(t, root, "client-only intermediate", true, cli)
	bothCA := sign(t, root, "intermediate", true, srv, cli)
	for _, tc := range []struct {
		name   string
		chain  []*x509.Certificate
		member bool
	}{
		{"lockd cert node", []*x509.Certificate{leafOf(t, mustIssue(t, caPEM, Node, "n1"))}, true},
		{"lockd cert client", []*x509.Certificate{leafOf(t, mustIssue(t, caPEM, Client, "app"))}, false},
		{"server and client", []*x509.Certificate{sign(t, ca, "a", false, srv, cli).cert}, true},
		{"no extended key usage", []*x509.Certificate{sign(t, ca, "b", false).cert}, false},
		{"server only", []*x509.Certificate{sign(t, ca, "c", false, srv).cert}, false},
		{"client only", []*x509.Certificate{sign(t, ca, "d", false, cli).cert}, false},
		{"any only", []*x509.Certificate{sign(t, ca, "e", false, anyU).cert}, false},
		{"any, server and client", []*x509.Certificate{sign(t, ca, "f", false, anyU, srv, cli).cert}, true},
		{"under a client-only intermediate", []*x509.Certificate{sign(t, clientOnlyCA, "g", false, srv, cli).cert, clientOnlyCA.cert}, false},
		{"under an intermediate", []*x509.Certificate{sign(t, bothCA, "h", false, srv, cli).cert, bothCA.cert}, true},
		{"the client CA's node", []*x509.Certificate{leafOf(t, mustIssue(t, otherPEM, Node, "n2"))}, false},
		{"none", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := m.VerifyMember(tc.chain)
			if tc.member {
				if err != nil || leaf != tc.chain[0] {
					t.Fatalf("a member refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotMember) {
				t.Fatalf("a non-member: %v, want ErrNotMember", err)
			}
		})
	}
}
