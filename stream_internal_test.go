package lockd

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// A stream being opened to a node that accepts connections and never
// answers (a fake of a frozen node: a real one cannot be frozen at this
// exact point on demand) must not hold up the endpoint's other calls past
// their own deadlines: a keepalive waits at most its ctx, not the opener's
// long-poll budget.
func TestStreamOpenDoesNotHoldEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan struct{}, 16)
	var conns sync.WaitGroup
	done := make(chan struct{})
	defer func() { close(done); ln.Close(); conns.Wait() }()
	conns.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dialed <- struct{}{}
			conns.Go(func() { <-done; conn.Close() })
		}
	})
	c, err := New(WithEndpoints("http://"+ln.Addr().String()), WithStream(true))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ep := c.eps[0]

	long, cancelLong := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancelLong()
	var opener sync.WaitGroup
	defer opener.Wait()
	defer cancelLong()
	opener.Go(func() { _, _ = c.openStream(long, ep) })
	select {
	case <-dialed: // the open is under way, waiting for an answer
	case <-time.After(10 * time.Second):
		t.Fatal("the opener never reached the node")
	}

	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.openStream(short, ep); err == nil {
		t.Fatal("opened a stream to a node that never answers")
	}
	if waited := time.Since(start); waited > 3*time.Second {
		t.Fatalf("a call with a 200ms deadline waited %v behind another call's open", waited)
	}
}
