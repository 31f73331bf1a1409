// Package redistest starts real redis-server processes for tests, on free
// 127.0.0.1 ports with a temporary directory and no persistence, stopped by
// t.Cleanup.
//
// When the redis-server binary is not on PATH, New skips the test — or
// fails it when the CI environment variable is "true", so that CI cannot
// pass by skipping.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long New and Start wait for a server to answer.
const startTimeout = 10 * time.Second

// Server is a redis-server process.
type Server struct {
	t      testing.TB
	bin    string
	dir    string
	port   int
	extra  []string
	cmd    *exec.Cmd
	exited chan struct{}
	// tempDir: Stop removes dir (Launch made it; New's is t.TempDir).
	tempDir bool
}

// New starts a redis-server with extra arguments appended to its command
// line (for example "--maxmemory-policy", "allkeys-random").
func New(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redistest: redis-server not found (CI=true; install the redis-server package): %v", err)
		}
		t.Skipf("redistest: redis-server not found, skipping (install the redis-server package): %v", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), extra: extra}
	t.Cleanup(s.Stop)
	var last error
	for range 5 { // another process may take the free port first
		s.port = freePort(t)
		if last = s.start(); last == nil {
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", last)
	return nil
}

// ErrNotInstalled is Launch's error when redis-server is not on PATH.
var ErrNotInstalled = errors.New("redistest: redis-server not found (install the redis-server package)")

// Launch starts a redis-server without a test (a TestMain, a testable
// example); the caller stops it with Stop, which also removes its
// directory. ErrNotInstalled when there is none to start. The Server's
// Start, Pause and Resume need a test: use New for those.
func Launch(extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	dir, err := os.MkdirTemp("", "lockd-redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, extra: extra, tempDir: true}
	var last error
	for range 5 { // another process may take the free port first
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		if last = s.start(); last == nil {
			return s, nil
		}
	}
	return nil, errors.Join(fmt.Errorf("redistest: start redis-server: %w", last), os.RemoveAll(dir))
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() error {
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--loglevel", "warning", "--logfile", "",
	}, s.extra...)
	cmd := exec.Command(s.bin, args...)
	out, err := os.Create(fmt.Sprintf("%s/redis-%d.log", s.dir, time.Now().UnixNano()))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(out.Name())
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, strings.TrimSpace(string(log)))
		default:
		}
		if ping(s.Addr()) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d did not answer within %v", s.port, startTimeout)
		}
		time.Sleep(10 * time.Millisecond) // polling a real process, with a deadline
	}
}

// ping sends one PING over a fresh connection.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New("unexpected answer " + line)
	}
	return nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// PID is the server's process id (0 when stopped).
func (s *Server) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client returns a go-redis client for the server with
// ContextTimeoutEnabled (contexts bound socket reads too), closed by
// t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		DialerRetries:         1,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server (SIGKILL, like a crash) and waits for it to exit.
// It is safe to call more than once.
func (s *Server) Stop() {
	s.kill()
	if s.tempDir {
		_ = os.RemoveAll(s.dir)
	}
}

func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Start starts a stopped server again on the same port and directory
// (without persistence it comes back empty, like a restart that lost its
// data).
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatalf("redistest: server on port %d is running", s.port)
	}
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// Pause stops the server process (SIGSTOP): connections stay open and
// requests hang, like a stalled host.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatalf("redistest: server on port %d is not running", s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v: %v", sig, err)
	}
}

// Do runs one command on a fresh short-lived client: for test set-up and
// inspection (FLUSHALL, CONFIG SET, PTTL, ...).
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}
