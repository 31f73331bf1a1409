package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// heldWithWaiter makes lock name held by a session owned by "holder@a"
// and waited for by one owned by "waiter@b"; it returns the holder's token.
func heldWithWaiter(t *testing.T, url, name string) uint64 {
	t.Helper()
	svc := lockdv1connect.NewLockServiceClient(http.DefaultClient, url, connect.WithInterceptors(lockdtest.Secrets()))
	ctx := context.Background()
	session := func(owner string) string {
		r, err := svc.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute), Owner: owner}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.SessionId
	}
	h, w := session("holder@a"), session("waiter@b")
	g, err := svc.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: h, Seq: 1, Name: name}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := svc.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: w, Seq: 1, Name: name, Wait: true, PollTimeout: durationpb.New(0)}))
	if err != nil || r.Msg.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED {
		t.Fatalf("waiter: %v %v", r, err)
	}
	return g.Msg.Token
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// TestTopInTerminal runs `lockd top` in a pseudo-terminal: its screen shows
// the held lock with its holder and its waiter, and q ends it with status
// 0. The last screen is saved as text (docs/img/top.txt when
// LOCKD_SCREENSHOTS=1).
func TestTopInTerminal(t *testing.T) {
	needBinary(t)
	srv := lockdtest.New(t)
	const name = "billing/invoices/2026-11"
	token := heldWithWaiter(t, srv.URL(), name)

	cmd := exec.Command(lockdBin, "top", "--endpoints", srv.URL(), "--interval", "200ms")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 110})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		tty.Close()
	})
	var mu sync.Mutex
	var out strings.Builder
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		b := make([]byte, 4096)
		for {
			n, err := tty.Read(b)
			mu.Lock()
			out.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	// lastScreen is the text of the newest complete frame (each starts by
	// moving the cursor home).
	lastScreen := func() string {
		mu.Lock()
		defer mu.Unlock()
		frames := strings.Split(out.String(), "\x1b[H")
		if len(frames) < 3 {
			return ""
		}
		return ansi.ReplaceAllString(strings.ReplaceAll(frames[len(frames)-2], "\r\n", "\n"), "")
	}
	deadline := time.Now().Add(15 * time.Second)
	var screen string
	for {
		screen = lastScreen()
		if strings.Contains(screen, name) && regexp.MustCompile(`(?m)^\s+`+regexp.QuoteMeta(name)+`\s+holder@a\s+`+strconv.FormatUint(token, 10)+`\s`).MatchString(screen) &&
			regexp.MustCompile(`(?m)^\s+`+regexp.QuoteMeta(name)+`\s+1\s+waiter@b`).MatchString(screen) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top never showed the holder and the waiter of %s; last screen:\n%s", name, screen)
		}
		time.Sleep(50 * time.Millisecond) // polling a real process
	}
	if !strings.Contains(screen, "leader ") || strings.Contains(screen, "leader NONE") {
		t.Errorf("top does not name the leader:\n%s", screen)
	}
	saveText(t, "top.txt", screen)

	if _, err := tty.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("top after q: %v, want exit status 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("top did not quit on q")
	}
	// The reader drains what top wrote before it exited, then gets EIO.
	select {
	case <-readDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal was not closed after top exited")
	}
	mu.Lock()
	tail := out.String()
	mu.Unlock()
	if !strings.HasSuffix(tail, "\x1b[?25h\x1b[?1049l") {
		t.Errorf("top did not restore the screen and the cursor on exit: output ends %q", tail[max(0, len(tail)-40):])
	}
}

// TestTopPlainWhenNotTerminal: with stdout not a terminal, top prints one
// snapshot without escape codes and exits.
func TestTopPlainWhenNotTerminal(t *testing.T) {
	srv := lockdtest.New(t)
	heldWithWaiter(t, srv.URL(), "jobs/nightly")
	stdout, stderr, err := runMain(t, srv.URL(), "top")
	if err != nil || stderr != "" {
		t.Fatalf("top: %v, stderr %q", err, stderr)
	}
	if strings.Contains(stdout, "\x1b") {
		t.Errorf("top wrote escape codes to a non-terminal:\n%q", stdout)
	}
	for _, want := range []string{"BUSIEST LOCKS", "LONGEST HOLDS", "LONGEST QUEUES", "SESSIONS NEAR EXPIRY", "holder@a", "waiter@b", "jobs/nightly"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("top output lacks %q:\n%s", want, stdout)
		}
	}
}

// saveText writes a text screenshot to docs/img when LOCKD_SCREENSHOTS=1,
// else to the test's temp dir.
func saveText(t *testing.T, name, text string) {
	t.Helper()
	dir := t.TempDir()
	if os.Getenv("LOCKD_SCREENSHOTS") == "1" {
		dir = filepath.Join("..", "..", "docs", "img")
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screen: %s", p)
}
