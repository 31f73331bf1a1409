package node

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/certs"
)

// A copy of internal/server's test CA (tls_test.go), for the Raft port's
// tests here.

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
