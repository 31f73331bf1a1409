package conformance

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy on 127.0.0.1 the suite controls: cut closes every
// connection through it (both sides), as a broken network path would,
// while new connections are still accepted. A real socket fault on
// demand, which a lockd node cannot produce by itself.
type proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	conns []net.Conn
	cuts  int
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	go p.serve()
	t.Cleanup(func() {
		l.Close()
		p.cut()
	})
	return p
}

func (p *proxy) url() string { return "http://" + p.l.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// cut closes every connection through the proxy and returns how many
// client connections it cut.
func (p *proxy) cut() int {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.cuts++
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns) / 2
}
