package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// browser starts headless Chromium (the Debian package) with a fresh
// profile and returns a chromedp context for one tab. Without Chromium the
// test skips, except under CI=true, where it fails.
func browser(t *testing.T, width, height int, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium not found (CI installs the Debian package chromium)")
		}
		t.Skip("chromium not found: apt-get install chromium to run the browser tests")
	}
	profile, err := os.MkdirTemp("", "lockd-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Chromium's helpers may still write for a moment after it stops.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // waiting on a real process
		}
	})
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(width, height),
	}, extra...)...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// client is a raw Connect client of the test server.
type client struct {
	t   *testing.T
	svc lockdv1connect.LockServiceClient
}

func (c *client) session(owner string, ttl time.Duration) string {
	c.t.Helper()
	r, err := c.svc.CreateSession(context.Background(), connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(ttl), Owner: owner}))
	if err != nil {
		c.t.Fatalf("create session: %v", err)
	}
	return r.Msg.SessionId
}

func (c *client) acquire(req *lockdv1.AcquireRequest) *lockdv1.AcquireResponse {
	c.t.Helper()
	r, err := c.svc.Acquire(context.Background(), connect.NewRequest(req))
	if err != nil {
		c.t.Fatalf("acquire %s: %v", req.Name, err)
	}
	return r.Msg
}

// poll waits until the JavaScript expression is truthy on the page, and
// fails with what the page shows otherwise.
func poll(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(pctx, chromedp.Poll[any](expr, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		shown, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("page never showed %s (%v); it shows:\n%s", what, err, shown)
	}
}

// TestDashboardShowsHolderQueueAndRelease opens /ui/ in headless Chromium:
// a lock the test acquires appears with its holder's owner and token, its
// queue (opened by a click) names the waiter, and the row goes away once
// the wait is cancelled and the lock released. It saves a screenshot
// (docs/img/dashboard.png when LOCKD_SCREENSHOTS=1).
func TestDashboardShowsHolderQueueAndRelease(t *testing.T) {
	srv := lockdtest.New(t)
	ctx := browser(t, 1280, 900)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}

	// Some company for the screenshot: a shared lock, a completed job.
	worker := c.session("billing-worker-1@host-a", time.Minute)
	c.acquire(&lockdv1.AcquireRequest{SessionId: worker, Seq: 1, Name: "billing/reports", Mode: lockdv1.Mode_MODE_SHARED, Limit: ptr(uint32(3))})
	other := c.session("billing-worker-2@host-b", time.Minute)
	c.acquire(&lockdv1.AcquireRequest{SessionId: other, Seq: 1, Name: "billing/reports", Mode: lockdv1.Mode_MODE_SHARED})
	g := c.acquire(&lockdv1.AcquireRequest{SessionId: other, Seq: 2, Name: "billing/invoices/2026-10"})
	if _, err := c.svc.Complete(context.Background(), connect.NewRequest(&lockdv1.CompleteRequest{SessionId: other, Seq: 3, Name: "billing/invoices/2026-10", Token: g.Token, Retention: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}

	const name = "billing/invoices/2026-11"
	holder := c.session("invoicer@host-a", 30*time.Second)
	waiter := c.session("invoicer@host-b", 30*time.Second)
	held := c.acquire(&lockdv1.AcquireRequest{SessionId: holder, Seq: 1, Name: name})
	if q := c.acquire(&lockdv1.AcquireRequest{SessionId: waiter, Seq: 1, Name: name, Wait: true, PollTimeout: durationpb.New(0)}); q.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED {
		t.Fatalf("waiter: %v, want queued", q)
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL()+"/ui/?refresh=300")); err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`document.querySelector('tr[data-lock=%q]')`, name)
	token := "#" + strconv.FormatUint(held.Token, 10)
	// The holder's owner and exactly its token (a token with one more digit
	// would not do) in the same holder line.
	poll(t, ctx, "the holder and token", fmt.Sprintf(`%s && [...%s.querySelectorAll(".holder")].some((h) => h.querySelector("b").textContent === "invoicer@host-a" && h.querySelector(".token").textContent === %q)`, row, row, token))
	// The queue opens on a click and lists the waiter.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](row+`.querySelector("button[data-queue]").click()`)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the waiter in the queue", fmt.Sprintf(`%s && %s.querySelector("ol.queue li") && %s.querySelector("ol.queue li").innerText.includes("invoicer@host-b")`, row, row, row))
	// The session table names what each session holds and waits for.
	poll(t, ctx, "the sessions' locks", fmt.Sprintf(`document.querySelector('tr[data-session=%q]') && document.querySelector('tr[data-session=%q]').innerText.includes(%q)`, waiter, waiter, name))
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](row+`.innerText`)); err != nil || !containsAll(got, "invoicer@host-a", token, "exclusive") {
		t.Fatalf("lock row shows %q (%v)", got, err)
	}
	// Two refreshes later the chart has samples too.
	poll(t, ctx, "a chart sample", `document.getElementById("rate-now").textContent !== ""`)

	// The feed is live, or says the server has no watch stream; either way
	// the tables above did not need it.
	poll(t, ctx, "the feed's state", `(() => { const s = document.getElementById("events-state").textContent; return s === "live" || s.startsWith("not available"); })()`)

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	savePNG(t, "dashboard.png", shot)

	if _, err := c.svc.Cancel(context.Background(), connect.NewRequest(&lockdv1.CancelRequest{SessionId: waiter, Seq: 2, Name: name, AcquireSeq: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.svc.Release(context.Background(), connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: holder, Seq: 2, Name: name, Token: held.Token})); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the released lock gone", "!"+row)
	poll(t, ctx, "the other locks still there", `document.querySelector('tr[data-lock="billing/reports"]') !== null`)
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }

// savePNG writes a screenshot to docs/img when LOCKD_SCREENSHOTS=1 (to
// refresh the pictures in docs/img), else to the test's temp dir.
func savePNG(t *testing.T, name string, b []byte) {
	t.Helper()
	dir := t.TempDir()
	if os.Getenv("LOCKD_SCREENSHOTS") == "1" {
		dir = filepath.Join("..", "..", "docs", "img")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", p, len(b))
}

// TestDashboardRebindingRefused: a real browser against the quick-start
// node. At http://localhost:PORT/ui/ the dashboard works (its Connect
// calls carry that Origin, its feed is live); a name that resolves to
// 127.0.0.1 but is not the node's (what a DNS rebinding attack makes of
// evil.example, here by Chromium's host resolver rules) gets the 403 of
// the Host check, not the dashboard.
func TestDashboardRebindingRefused(t *testing.T) {
	srv := lockdtest.New(t)
	ctx := browser(t, 1024, 768, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}
	holder := c.session("rebind@host-a", 30*time.Second)
	c.acquire(&lockdv1.AcquireRequest{SessionId: holder, Seq: 1, Name: "rebind/x"})

	port := strings.TrimPrefix(srv.URL(), "http://127.0.0.1:")
	if err := chromedp.Do(ctx, chromedp.Navigate("http://localhost:"+port+"/ui/?refresh=300")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the lock at localhost", `document.querySelector('tr[data-lock="rebind/x"]') !== null`)
	poll(t, ctx, "the live feed at localhost", `document.getElementById("events-state").textContent === "live"`)

	if err := chromedp.Do(ctx, chromedp.Navigate("http://evil.example:"+port+"/ui/")); err != nil {
		t.Fatal(err)
	}
	body, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `Host "evil.example:`+port+`"`) || !strings.Contains(body, "--allowed-hosts") || strings.Contains(body, "rebind/x") {
		t.Fatalf("http://evil.example:%s/ui/ shows %q; want the Host check's refusal", port, body)
	}
}
