package lockd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestSnapshotRefusesPlaintextRedirect: a snapshot call made over TLS does
// not follow a redirect to http, so the token is never sent in plaintext.
// The two servers are stand-ins (httptest), not lockd nodes: a lockd node
// only redirects to its leader's advertised URL, so a misconfigured or
// hostile node is the fault here, and a real node cannot be made to
// produce it on demand.
func TestSnapshotRefusesPlaintextRedirect(t *testing.T) {
	var sawToken atomic.Bool
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			sawToken.Store(true)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer tlsSrv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(tlsSrv.Certificate())
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(tlsSrv.URL), lockd.WithTLSConfig(&tls.Config{RootCAs: pool}),
		lockd.WithToken("secret-token"), lockd.WithStream(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = c.Snapshot(ctx, &discard{})
	if err == nil {
		t.Fatal("snapshot followed a redirect to http")
	}
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("error %v (code %v), want FailedPrecondition, not a retried one", err, connect.CodeOf(err))
	}
	if sawToken.Load() {
		t.Error("the token reached the plaintext server")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
