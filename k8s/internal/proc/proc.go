// Package proc starts the real processes the module's tests use: lockd
// built from this tree, and programs of this module, on 127.0.0.1 ports.
package proc

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
	dir     string
)

// Build compiles the package pkg ("./cmd/x") of the module in dir
// ("repo": the lockd repository, "k8s": this module) once per test binary
// and returns the executable's path.
func Build(t testing.TB, module, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	key := module + " " + pkg
	if p, ok := built[key]; ok {
		return p
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "lockd-k8s-bin-")
		if err != nil {
			t.Fatal(err)
		}
		dir = d
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..") // the k8s module
	if module == "repo" {
		root = filepath.Join(root, "..")
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[key] = out
	return out
}

var (
	portMu sync.Mutex
	given  = map[int]bool{}
)

// FreePort returns a 127.0.0.1 port that was free, never the same one
// twice in a process.
func FreePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[p] {
			given[p] = true
			return p
		}
	}
}

// WaitHTTP polls url until it answers 200 or the deadline passes.
func WaitHTTP(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v (last: %v)", url, within, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a real process, bounded by the deadline
	}
}

// Node is one lockd process.
type Node struct {
	Name      string
	API, Raft string // 127.0.0.1:port
	Cmd       *exec.Cmd
	Log       *os.File
}

// URL is the node's API URL.
func (n *Node) URL() string { return "http://" + n.API }

// Stop kills the node's process (SIGKILL) and waits for it.
func (n *Node) Stop() {
	if n.Cmd != nil && n.Cmd.Process != nil {
		_ = n.Cmd.Process.Kill()
		_ = n.Cmd.Wait()
	}
}

// Cluster starts n lockd nodes named lockd-0 … lockd-(n-1): lockd-0
// bootstraps, the others join it; it waits until every node is ready and
// stops them when the test ends.
func Cluster(t testing.TB, lockdBin string, n int) []*Node {
	t.Helper()
	var nodes []*Node
	for i := range n {
		nd := &Node{Name: fmt.Sprintf("lockd-%d", i), API: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), Raft: fmt.Sprintf("127.0.0.1:%d", FreePort(t))}
		args := []string{"serve", "--node-id", nd.Name, "--data-dir", filepath.Join(t.TempDir(), nd.Name),
			"--listen", nd.API, "--raft-listen", nd.Raft, "--log-level", "warn"}
		if i > 0 {
			args = append(args, "--join", nodes[0].URL())
		}
		log, err := os.Create(filepath.Join(t.TempDir(), nd.Name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		nd.Log = log
		nd.Cmd = exec.Command(lockdBin, args...)
		nd.Cmd.Stdout, nd.Cmd.Stderr = log, log
		if err := nd.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nd.Stop)
		nodes = append(nodes, nd)
		if err := WaitHTTP(nd.URL()+"/readyz", time.Minute); err != nil {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("%s: %v\n%s", nd.Name, err, b)
		}
	}
	return nodes
}
