// Package proctest holds what the tests that run lockd as real processes
// share: free ports for servers started later, and polling with a
// deadline.
package proctest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// given holds every port FreePort returned in this process.
var given sync.Map

// FreePort returns a 127.0.0.1 address free now, for a server started
// later. It is chosen below the kernel's ephemeral range (32768 and up on
// Linux), so that between this check and the server's bind no outgoing
// connection of another process can be given the port (the way
// 127.0.0.1:0 was seen to collide when tests ran in parallel). A port is
// free only until its user binds it, and a cluster takes all its ports
// before it starts a node, so none is handed out twice in one process.
func FreePort(t testing.TB) string {
	t.Helper()
	for range 200 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		l.Close()
		if _, taken := given.LoadOrStore(addr, true); taken {
			continue
		}
		return addr
	}
	t.Fatal("no free port in 20000-31999")
	return ""
}

// Poll calls cond every interval until it holds (true) or timeout passes
// (false): for conditions on real processes and sockets, which no
// synthetic clock can advance.
func Poll(timeout, every time.Duration, cond func() bool) bool {
	end := time.Now().Add(timeout)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		<-tick.C
	}
	return true
}
