package server

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/fsm"
)

// With auth on, `lockd snapshot save` through a follower is redirected to
// the leader on another host, and the token goes along: Go's HTTP client
// drops Authorization on a redirect to another host, so without the
// client's re-authorization the leader would answer unauthenticated. The
// follower is reached as localhost and redirects to the leader's
// advertised 127.0.0.1: another host to Go, with no second machine.
func TestSnapshotRedirectKeepsToken(t *testing.T) {
	dir := t.TempDir()
	authFile, peerFile := writePeerAuth(t, dir, "")
	opts := defaultClusterOpts()
	opts.security = Security{AuthFile: authFile, PeerTokenFile: peerFile}
	c := newTestCluster(t, 3, opts)
	leader, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(c.nodes[(leader+1)%3].url)
	if err != nil {
		t.Fatal(err)
	}
	if h, _, _ := net.SplitHostPort(u.Host); h != "127.0.0.1" {
		t.Fatalf("follower URL %s: the test needs 127.0.0.1 to reach it as localhost", u)
	}
	_, port, _ := net.SplitHostPort(u.Host)
	follower := "http://localhost:" + port
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	save := func(token string) ([]byte, error) {
		cl, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(follower), lockd.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close(context.Background())
		var b bytes.Buffer
		_, err = cl.Snapshot(ctx, &b)
		return b.Bytes(), err
	}
	b, err := save("admin-token")
	if err != nil {
		t.Fatalf("snapshot through the follower as admin: %v", err)
	}
	if err := fsm.CheckBackup(b); err != nil {
		t.Fatalf("the backup does not load: %v", err)
	}
}
