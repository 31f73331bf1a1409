package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/certs"
)

// rssOf returns a process's resident set size (VmRSS), in bytes.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc to measure memory: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/PID/status")
	return 0
}

// TestServeRaftPortMembersOnly, with the
// certificates `lockd cert` makes and a `lockd serve` process: the node
// certificate is a member's and the client one is not; on the node's Raft
// port the client certificate fails the TLS handshake and the node
// certificate completes it; 300 idle TCP connections (no certificate, no
// byte), after 3000 opened and dropped, are all closed within the
// handshake deadline, and the process's resident memory stays within
// 64 MiB of what it was throughout.
func TestServeRaftPortMembersOnly(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	for _, args := range [][]string{{"cert", "ca", "--dir", pki}, {"cert", "node", "n1", "--dir", pki}, {"cert", "client", "app", "--dir", pki}} {
		if _, errOut, code := tlsCLI(t, dir, nil, args...); code != 0 {
			t.Fatalf("lockd %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
	}
	file := func(name string) string { return filepath.Join(pki, name) }
	st, err := certs.Load(certs.Files{CA: file("ca.crt"), Cert: file("n1.crt"), Key: file("n1.key")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pair := func(name string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(file(name+".crt"), file(name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	node, app := pair("n1"), pair("app")
	if _, err := st.Current().VerifyMember([]*x509.Certificate{node.Leaf}); err != nil {
		t.Fatalf("lockd cert node: not a member's: %v", err)
	}
	if _, err := st.Current().VerifyMember([]*x509.Certificate{app.Leaf}); !errors.Is(err, certs.ErrNotMember) {
		t.Fatalf("lockd cert client: %v, want not a member's", err)
	}

	api, raftAddr := freePort(t), freePort(t)
	logFile := filepath.Join(dir, "n1.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(lockdBin, "serve", "--node-id", "n1", "--data-dir", filepath.Join(dir, "data"),
		"--listen", api, "--raft-listen", raftAddr,
		"--tls-cert", file("n1.crt"), "--tls-key", file("n1.key"), "--tls-ca", file("ca.crt"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("server log:\n%s", b)
		}
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(must(os.ReadFile(file("ca.crt"))))
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{app}}}}
	defer hc.CloseIdleConnections()
	if !poll(20*time.Second, func() bool {
		resp, err := hc.Get("https://" + api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatal("lockd serve not ready after 20s")
	}

	raftDial := func(c tls.Certificate) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", raftAddr,
			&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{c}, NextProtos: []string{certs.PeerProto}})
	}
	// The client certificate: the alert follows the client's side of a
	// TLS 1.3 handshake.
	if c, err := raftDial(app); err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "bad certificate") {
			t.Fatalf("client certificate on the raft port: %v, want a bad certificate alert", err)
		}
	}
	// The node certificate: the connection is Raft's, which waits for a
	// request.
	c, err := raftDial(node)
	if err != nil {
		t.Fatalf("node certificate on the raft port: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("node certificate on the raft port: read %v, want an open connection", err)
	}
	c.Close()

	// An attacker that reconnects: ten rounds of 300 connections opened
	// and dropped (on today's main each got Raft's 256 KiB buffers, and
	// the reused memory drove the process's RSS up), then 300 idle
	// connections kept open.
	pid := cmd.Process.Pid
	before := rssOf(t, pid)
	peak := before
	for range 10 {
		var cs []net.Conn
		for range 300 {
			c, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			cs = append(cs, c)
		}
		for _, c := range cs {
			c.Close()
		}
		peak = max(peak, rssOf(t, pid))
	}
	const flood, handshakeDeadline = 300, 5 * time.Second
	start := time.Now()
	var conns []net.Conn
	for range flood {
		c, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	var open atomic.Int64
	var wg sync.WaitGroup
	deadline := start.Add(handshakeDeadline + 5*time.Second) // generous: a busy machine
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(deadline)
			var ne net.Error
			if _, err := io.ReadAll(c); errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			}
		})
	}
	// The peak while they are open or closing.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for tick := time.NewTicker(50 * time.Millisecond); ; {
		peak = max(peak, rssOf(t, pid))
		select {
		case <-tick.C:
			continue
		case <-done:
			tick.Stop()
		}
		break
	}
	t.Logf("rss %d MiB before, peak %d MiB with 3000 dropped and %d idle connections, these for %v", before>>20, peak>>20, flood, time.Since(start).Round(time.Millisecond))
	if n := open.Load(); n > 0 {
		t.Fatalf("%d of %d idle connections still open %v after they were made", n, flood, deadline.Sub(start))
	}
	if grew := peak - before; grew > 64<<20 {
		t.Errorf("rss grew by %d MiB, want under 64 MiB", grew>>20)
	}
	if b, _ := os.ReadFile(logFile); !strings.Contains(string(b), "raft port: refused") {
		t.Error("no log line about the refused connections")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
