package guard

import (
	"net"
	"net/netip"
	"testing"

	"github.com/lockd-dev/lockd/internal/sockettest"
)

// TestConnCapExempt: a source the exempt func names (another member) is
// never capped, and the counting stays right for it.
func TestConnCapExempt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	l := newConnCap(ln, 1, func(ip netip.Addr) bool { return ip == netip.MustParseAddr("127.0.0.3") }, func(net.Conn, int) { refused++ })
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func(ip string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var clients []net.Conn
	for range 3 {
		clients = append(clients, dial("127.0.0.3"))
		<-accepted
	}
	if n := l.open(netip.MustParseAddr("127.0.0.3")); n != 3 {
		t.Errorf("exempt source: %d counted, want 3", n)
	}
	clients = append(clients, dial("127.0.0.4"))
	c := <-accepted
	if err := sockettest.ClosedAtOnce("127.0.0.4", ln.Addr().String()); err != nil { // refused in Accept: never handed out
		t.Errorf("over the cap: %v", err)
	}
	c.Close()
	c.Close() // a second Close frees nothing more
	if n := l.open(netip.MustParseAddr("127.0.0.4")); n != 0 {
		t.Errorf("after Close: %d counted, want 0", n)
	}
	for _, c := range clients {
		c.Close()
	}
	l.Close()
	for range accepted {
	}
	if refused != 1 {
		t.Errorf("refused %d, want 1", refused)
	}
}
