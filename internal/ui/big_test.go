package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// TestDashboardBig measures the dashboard with 10 000 locks held by 1 000
// sessions: the time to the first rendered tables and the time of one
// update, printed, not asserted. The tables are paged (locks by the
// server, 50 a page; sessions in the page), so neither grows with the
// state. Run with LOCKD_BIG=1 (about 20 s to set up under -race).
func TestDashboardBig(t *testing.T) {
	if os.Getenv("LOCKD_BIG") != "1" {
		t.Skip("set LOCKD_BIG=1 to measure the dashboard with 10 000 locks and 1 000 sessions")
	}
	srv := lockdtest.New(t)
	ctx := browser(t, 1280, 900)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}
	const sessions, perSession = 1000, 10
	start := time.Now()
	ids := make([]string, sessions)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				ids[i] = c.session(fmt.Sprintf("worker-%04d@host-%d", i, i%20), 10*time.Minute)
				for j := range perSession {
					c.acquire(&lockdv1.AcquireRequest{SessionId: ids[i], Seq: uint64(j + 1), Name: fmt.Sprintf("jobs/%02d/%04d-%d", i%50, i, j)})
				}
			}
		})
	}
	for i := range sessions {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("set up %d locks held by %d sessions in %v", sessions*perSession, sessions, time.Since(start).Round(time.Millisecond))

	nav := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the first render", `window.lockdStats && window.lockdStats.updates >= 1`)
	wall := time.Since(nav)
	first, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.lockdStats.firstRender`))
	if err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "three updates", `window.lockdStats.updates >= 3`)
	update, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.lockdStats.lastUpdate`))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#locks tbody tr").length + document.querySelectorAll("#sessions tbody tr").length`))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	shown, _ := chromedp.Run(pctx, chromedp.Evaluate[string](`document.getElementById("node").textContent`))
	fmt.Printf("dashboard, %d locks and %d sessions: first render %.0f ms after navigation start (%v wall from Navigate), one update (fetch + render) %.0f ms, %d table rows in the DOM; header: %s\n",
		sessions*perSession, sessions, first, wall.Round(time.Millisecond), update, rows, shown)
}
