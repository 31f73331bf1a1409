package lockd_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// frozenListener accepts connections and never answers on them: a fake of
// a SIGSTOPped node (its kernel still completes TCP handshakes into the
// listen backlog, but no request gets an answer), which a test cannot
// freeze in-process.
func frozenListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// A hung endpoint does not stall new clients: with a frozen node first in
// the list and a good one second, every new client (a new `lockd run`)
// gets its lock in less than the old fixed 5 s attempt timeout, as its
// attempts are bounded by its short TTL and its deadline, and it may start
// at either endpoint.
func TestFrozenEndpointDoesNotStallNewClients(t *testing.T) {
	srv := lockdtest.New(t)
	frozen := frozenListener(t)
	const (
		ttl    = 2 * time.Second
		budget = 3500 * time.Millisecond // TTL·0.99 − margin = 1.88 s, plus the good node's answers, plus slack
	)
	for i := range 4 {
		c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(frozen, srv.URL()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		start := time.Now()
		s, err := c.NewSession(ctx, lockd.WithTTL(ttl))
		if err == nil {
			m := s.NewMutex("cron")
			if err = m.TryLock(ctx); err == nil {
				err = m.Unlock(ctx)
			}
		}
		took := time.Since(start)
		cancel()
		if cerr := c.Close(context.Background()); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("client %d: %v after %v", i, err, took)
		}
		t.Logf("client %d: lock taken and released in %v", i, took.Round(time.Millisecond))
		if took > budget {
			t.Errorf("client %d took %v with a frozen endpoint first, want under %v", i, took, budget)
		}
	}
}
