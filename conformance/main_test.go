package conformance

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/proctest"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

var (
	lockdBin    string   // the built lockd
	goDriverBin string   // the built Go driver
	driverCmd   []string // the driver under test
	buildErr    error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockd-conformance-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin = filepath.Join(dir, "lockd")
	goDriverBin = filepath.Join(dir, "godriver")
	for _, b := range []struct{ out, pkg string }{{lockdBin, "../cmd/lockd"}, {goDriverBin, "./godriver"}} {
		if out, err := exec.Command("go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
			break
		}
	}
	driverCmd = []string{goDriverBin}
	if env := strings.Fields(os.Getenv("LOCKD_CONFORMANCE_DRIVER")); len(env) > 0 {
		driverCmd = env
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// needBinaries skips (fails under CI=true) when the binaries were not built.
func needBinaries(t *testing.T) {
	t.Helper()
	if buildErr == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(buildErr)
	}
	t.Skipf("binaries not built: %v", buildErr)
}

// Server timing: short Raft timeouts and grace, as in cmd/lockd's e2e tests.
const (
	testElection = 100 * time.Millisecond
	testGrace    = 100 * time.Millisecond
)

// freePort returns a 127.0.0.1 address free now, for a server started
// later (proctest.FreePort).
func freePort(t *testing.T) string { return proctest.FreePort(t) }

// server is one `lockd serve` process.
type server struct {
	id, data, api, raft string
	cmd                 *exec.Cmd
	log                 string
	exited              chan struct{}
}

func (s *server) url() string { return "http://" + s.api }

// startServer starts a `lockd serve` with extra flags and waits until
// readyPath answers 200.
func startServer(t *testing.T, s *server, readyPath string, extra ...string) {
	t.Helper()
	needBinaries(t)
	s.log = filepath.Join(t.TempDir(), s.id+".log")
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.exited = make(chan struct{})
	s.cmd = exec.Command(lockdBin, append([]string{"serve",
		"--node-id", s.id, "--data-dir", s.data,
		"--listen", s.api, "--raft-listen", s.raft,
		"--heartbeat-timeout", testElection.String(),
		"--election-timeout", testElection.String(),
		"--grace", testGrace.String()}, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("server %s log:\n%s", s.id, tail(b, 4000))
		}
	})
	hc := &http.Client{Timeout: time.Second}
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		resp, err := hc.Get(s.url() + readyPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("lockd serve %s not ready after 30s", s.id)
	}
	select {
	case <-s.exited:
		b, _ := os.ReadFile(s.log)
		t.Fatalf("lockd serve %s exited: %s", s.id, tail(b, 4000))
	default:
	}
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("node %s still running 10s after kill -9", s.id)
	}
}

// cluster is a set of lockd serve processes.
type cluster struct {
	nodes []*server
	token string // a token for the suite's own calls (auth on)
}

// startCluster starts n nodes, the first bootstrapping, the others joining
// it, and waits until all agree on a leader with n voters.
func startCluster(t *testing.T, n int, extra ...string) *cluster {
	t.Helper()
	needBinaries(t)
	dir := t.TempDir()
	c := &cluster{}
	for i := range n {
		c.nodes = append(c.nodes, &server{id: fmt.Sprintf("n%d", i+1), data: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), api: freePort(t), raft: freePort(t)})
	}
	start := time.Now()
	for i, s := range c.nodes {
		if i == 0 {
			startServer(t, s, "/readyz", extra...)
			continue
		}
		startServer(t, s, "/healthz", append([]string{"--join", c.nodes[0].url()}, extra...)...)
	}
	if n > 1 {
		c.waitVoters(t, c.waitLeader(t, c.nodes, 30*time.Second), n, 30*time.Second)
	}
	t.Logf("%d-node cluster up in %v", n, time.Since(start).Round(time.Millisecond))
	return c
}

// endpoints is the LOCKD_ENDPOINTS value naming every node.
func (c *cluster) endpoints() string {
	var urls []string
	for _, s := range c.nodes {
		urls = append(urls, s.url())
	}
	return strings.Join(urls, ",")
}

// api returns a raw client of one node for the suite's own observations.
func (c *cluster) api(s *server) lockdv1connect.LockServiceClient {
	var opts []connect.ClientOption
	if c.token != "" {
		opts = append(opts, connect.WithInterceptors(bearer(c.token)))
	}
	return lockdv1connect.NewLockServiceClient(&http.Client{Timeout: 5 * time.Second}, s.url(), opts...)
}

// bearer sets the Authorization header of unary calls.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
		r.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, r)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, s)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// leader returns the node that all live nodes name as leader, or nil.
func (c *cluster) leader(live []*server) *server {
	var id string
	for _, s := range live {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.api(s).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		cancel()
		if err != nil || resp.Msg.GetLeader() == "" || id != "" && resp.Msg.GetLeader() != id {
			return nil
		}
		id = resp.Msg.GetLeader()
	}
	for _, s := range c.nodes {
		if s.id == id {
			return s
		}
	}
	return nil
}

// waitLeader waits until every node in live names one leader among them.
func (c *cluster) waitLeader(t *testing.T, live []*server, timeout time.Duration) *server {
	t.Helper()
	var l *server
	if !pollUntil(timeout, 50*time.Millisecond, func() bool {
		l = c.leader(live)
		return l != nil && contains(live, l)
	}) {
		t.Fatalf("no leader agreed on by %d nodes within %v", len(live), timeout)
	}
	return l
}

// waitVoters waits until the leader lists n voters: a joined node is a
// non-voter until it has caught up, and a leader killed before its
// followers were promoted leaves no quorum to elect another.
func (c *cluster) waitVoters(t *testing.T, leader *server, n int, timeout time.Duration) {
	t.Helper()
	voters := 0
	if !pollUntil(timeout, 20*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := c.api(leader).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		if err != nil {
			return false
		}
		voters = 0
		for _, m := range resp.Msg.GetMembers() {
			if m.GetVoter() {
				voters++
			}
		}
		return voters >= n
	}) {
		t.Fatalf("the leader lists %d voters after %v, want %d", voters, timeout, n)
	}
}

func contains(list []*server, s *server) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// pollUntil calls cond every interval until it holds or timeout passes.
func pollUntil(timeout, every time.Duration, cond func() bool) bool {
	return proctest.Poll(timeout, every, cond)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
