package conformance

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// proxy is a TCP proxy on 127.0.0.1 the suite controls: cut closes every
// connection through it (both sides), as a broken network path would,
// while new connections are still accepted. A real socket fault on
// demand, which a lockd node cannot produce by itself.
type proxy struct {
	l      net.Listener
	target string
	delay  time.Duration // every byte from the server reaches the client this late

	mu    sync.Mutex
	conns []net.Conn
	cuts  int
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	return startDelayProxy(t, target, 0)
}

// startDelayProxy is startProxy whose answers (the bytes from the server)
// reach the client delay late, in order: a slow network path, which makes
// the send time of a request and the arrival of its answer far apart.
func startDelayProxy(t *testing.T, target string, delay time.Duration) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, delay: delay}
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
		if p.delay > 0 {
			go delayCopy(c, up, p.delay)
			continue
		}
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

// delayCopy copies src to dst, each chunk written delay after it was
// read, in order; it closes dst when src ends or a write fails.
func delayCopy(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			<-time.After(d) // the delay is the fault this proxy makes
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q { // let the reader end
			}
			return
		}
	}
}
