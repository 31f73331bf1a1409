package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// proxy forwards TCP connections from its own 127.0.0.1 port to one node's
// port (Raft or API). Each node advertises its proxies, so every
// connection another node opens to it passes one. The proxy learns which
// node opened a connection (from /proc: the process owning the socket)
// and drops it while the partition table cuts that direction.
type proxy struct {
	ln     net.Listener
	target string
	dst    string // node id behind the proxy
	cut    func(src, dst string) bool
	delay  func(from, to string) time.Duration // latency added to bytes from node from to node to
	owner  func(port, peer int) string         // node id owning the socket 127.0.0.1:port → 127.0.0.1:peer, "" if none
	mu     sync.Mutex
	conns  map[net.Conn]string // → source node id
	closed bool
}

func newProxy(target, dst string, cut func(src, dst string) bool, delay func(from, to string) time.Duration, owner func(port, peer int) string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, dst: dst, cut: cut, delay: delay, owner: owner, conns: map[net.Conn]string{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// track registers c as a connection from src, unless that direction is
// cut or the proxy closed.
func (p *proxy) track(c net.Conn, src string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut(src, p.dst) {
		return false
	}
	p.conns[c] = src
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *proxy) pipe(in net.Conn) {
	src := ""
	ra, ok1 := in.RemoteAddr().(*net.TCPAddr)
	la, ok2 := in.LocalAddr().(*net.TCPAddr)
	if ok1 && ok2 {
		src = p.owner(ra.Port, la.Port)
	}
	if !p.track(in, src) {
		in.Close()
		return
	}
	defer p.untrack(in)
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(out, src) {
		out.Close()
		return
	}
	defer p.untrack(out)
	done := make(chan struct{}, 2)
	go func() { p.copy(out, in, src, p.dst); done <- struct{}{} }()
	go func() { p.copy(in, out, p.dst, src); done <- struct{}{} }()
	<-done
}

// chunk is bytes read from one side, due on the other at a time.
type chunk struct {
	b   []byte
	due time.Time
}

// copy forwards from r to w, each chunk held back by the delay from node
// from to node to at the time it was read (0 unless a delaying partition
// is on), in order: a latency, not a bandwidth limit.
func (p *proxy) copy(w io.Writer, r io.Reader, from, to string) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := r.Read(b)
			if n > 0 {
				var d time.Duration
				if from != "" && to != "" {
					d = p.delay(from, to)
				}
				q <- chunk{b[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			t.Reset(d)
			<-t.C
		}
		if _, err := w.Write(c.b); err != nil {
			// Unblock the reader: closing the other side ends its Read.
			if cl, ok := r.(io.Closer); ok {
				cl.Close()
			}
			for range q {
			}
			return
		}
	}
}

// enforce closes the open connections the partition table now cuts.
func (p *proxy) enforce() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, src := range p.conns {
		if p.cut(src, p.dst) {
			c.Close()
		}
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
}

// socketInode finds the inode of the IPv4 TCP socket from 127.0.0.1:port
// to 127.0.0.1:peer, from /proc/net/tcp. Both ends are needed: Linux
// reuses a local port for connections to different peers.
func socketInode(port, peer int) (string, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	local, remote := fmt.Sprintf("0100007F:%04X", port), fmt.Sprintf("0100007F:%04X", peer)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && fs[1] == local && fs[2] == remote {
			return fs[9], nil
		}
	}
	return "", fmt.Errorf("no socket 127.0.0.1:%d → 127.0.0.1:%d", port, peer)
}

// ownsSocket reports whether process pid has the socket inode open.
func ownsSocket(pid int, inode string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}
