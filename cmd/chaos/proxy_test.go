package main

import (
	"bufio"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// The proxy holds bytes back by the delay of their direction, in order,
// and forwards them at once when the delay is back to 0 (the delaying
// partition of node-partition-delay). A real echo server behind it; the
// dialing node is stubbed as "a" (in a run it is read from /proc).
func TestProxyDelay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	var out, in atomic.Int64 // a → b and b → a, in ns
	delay := func(from, to string) time.Duration {
		if from == "a" && to == "b" {
			return time.Duration(out.Load())
		}
		return time.Duration(in.Load())
	}
	p, err := newProxy(ln.Addr().String(), "b", func(string, string) bool { return false }, delay, func(int, int) string { return "a" })
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(msg string) time.Duration {
		start := time.Now()
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil || line != msg+"\n" {
			t.Fatalf("echo %q: got %q, %v", msg, line, err)
		}
		return time.Since(start)
	}
	out.Store(int64(150 * time.Millisecond))
	in.Store(int64(100 * time.Millisecond))
	if d := echo("slow"); d < 250*time.Millisecond {
		t.Errorf("round trip %v with 150 ms + 100 ms of delay, want at least 250 ms", d)
	}
	out.Store(0)
	in.Store(0)
	if d := echo("fast"); d > 240*time.Millisecond {
		t.Errorf("round trip %v without delay, want well under 250 ms", d)
	}
}
