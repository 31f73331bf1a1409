package lockd_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// faultProxy is a TCP proxy in front of a node, for faults a real network
// or node does not produce on cue in process: a test can cut its
// connections (a network that breaks them), or freeze it — while frozen it
// accepts connections and reads nothing, and no byte passes either way,
// with every connection left open, as a SIGSTOPped node's kernel does (the
// process-level test TestClusterLeaderPause in cmd/lockd stops a real
// `lockd serve`).
type faultProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen chan struct{} // closed while thawed; nil when not frozen
	conns  []net.Conn
}

func newFaultProxy(t testing.TB, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.thaw()
		p.cut()
	})
	return p
}

func (p *faultProxy) URL() string { return "http://" + p.ln.Addr().String() }

// used reports whether any connection went through the proxy.
func (p *faultProxy) used() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) > 0
}

// cut closes every connection through the proxy.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *faultProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

func (p *faultProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// gate waits while the proxy is frozen.
func (p *faultProxy) gate() {
	p.mu.Lock()
	ch := p.frozen
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (p *faultProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, holding every chunk while the proxy is frozen.
func (p *faultProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		p.gate()
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = src.Close()
			}
			return
		}
	}
}
