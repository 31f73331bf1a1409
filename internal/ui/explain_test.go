package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
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

// xssName is a lock name that is markup: the page must show it as text.
// (The page's CSP would stop the handler anyway; an <img> element in the
// DOM is what the test looks for.)
const xssName = `<img src=x onerror=alert(1)>`

// explainChain makes, on a real server, a lock named xssName held by
// second@host-b, with <i>third</i>@host-c waiting for it, while second
// waits for ledger/eu, which fourth@host-d holds, and fourth waits for
// ledger/us, which <i>fifth</i>@host-e holds: a chain two deep. (No cycle:
// the server refuses every acquire that would close one.) It returns the
// holder's, the waiter's and the middle session's ids.
func explainChain(t *testing.T, c *client) (holder, waiter, middle string) {
	t.Helper()
	s2 := c.session("second@host-b", time.Minute)
	s3 := c.session("<i>third</i>@host-c", time.Minute)
	s4 := c.session("fourth@host-d", time.Minute)
	s5 := c.session("<i>fifth</i>@host-e", time.Minute)
	queue := func(s string, seq uint64, name string) {
		t.Helper()
		if q := c.acquire(&lockdv1.AcquireRequest{SessionId: s, Seq: seq, Name: name, Wait: true, PollTimeout: durationpb.New(0)}); q.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED {
			t.Fatalf("%s on %q: %v, want queued", s, name, q)
		}
	}
	c.acquire(&lockdv1.AcquireRequest{SessionId: s2, Seq: 1, Name: xssName})
	c.acquire(&lockdv1.AcquireRequest{SessionId: s4, Seq: 1, Name: "ledger/eu"})
	c.acquire(&lockdv1.AcquireRequest{SessionId: s5, Seq: 1, Name: "ledger/us"})
	queue(s3, 1, xssName)
	queue(s2, 2, "ledger/eu")
	queue(s4, 2, "ledger/us")
	return s2, s3, s4
}

// TestDashboardExplainChain opens the Explain view of a lock by clicking
// its name: the holder, the waiter with its wait, and the chain of what
// the holder waits for (depth 1, then depth 2 indented) show; the lock's name and an owner that are markup show as text. It
// checks the server's answer first, so a failure says which side is wrong.
func TestDashboardExplainChain(t *testing.T) {
	srv := lockdtest.New(t)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}
	holder, waiter, middle := explainChain(t, c)
	ex, err := c.svc.Explain(context.Background(), connect.NewRequest(&lockdv1.ExplainRequest{Name: xssName}))
	if err != nil {
		t.Fatal(err)
	}
	if ch := ex.Msg.GetChain(); len(ch) != 2 || ch[0].GetSessionId() != holder || ch[1].GetSessionId() != middle || ch[1].GetCycle() {
		t.Fatalf("the server's chain: %v, want second then fourth, no cycle", ch)
	}
	if ws := ex.Msg.GetLock().GetWaiters(); len(ws) != 1 || ws[0].GetSessionId() != waiter {
		t.Fatalf("the server's waiters: %v, want third", ws)
	}

	ctx := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL()+"/ui/?refresh=300")); err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`document.querySelector('tr[data-lock=%q]')`, xssName)
	poll(t, ctx, "the lock's row", row)
	poll(t, ctx, "the explain view hidden", `document.getElementById("explain-section").hidden`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](row+`.querySelector("button[data-explain]").click()`)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the lock's name as the view's title", fmt.Sprintf(`!document.getElementById("explain-section").hidden && document.getElementById("explain-name").textContent === %q`, xssName))
	poll(t, ctx, "the holder", `[...document.querySelectorAll(".explain-holders tbody tr")].some((r) => r.cells[0].querySelector("b").textContent === "second@host-b" && /#\d+/.test(r.cells[1].textContent))`)
	poll(t, ctx, "the waiter and its wait", `(() => { const r = document.querySelector(".explain-waiters tbody tr"); return r && r.cells[1].querySelector("b").textContent === "<i>third</i>@host-c" && /^\d/.test(r.cells[3].textContent); })()`)
	chain := `[...document.querySelectorAll(".explain-chain tbody tr")]`
	poll(t, ctx, "the chain", fmt.Sprintf(`%s.length === 2`, chain))
	type step struct {
		Depth            string
		Who, Lock, By    string
		Since, How       string
		Cycle            bool
		Indent           float64
		CycleMarkerShown bool
	}
	steps, err := chromedp.Run(ctx, chromedp.Evaluate[[]step](chain+`.map((r) => ({
		Depth: r.dataset.depth, Who: r.cells[0].querySelector("b").textContent, Lock: r.cells[1].textContent,
		Since: r.cells[2].textContent, By: r.cells[3].querySelector("b").textContent, How: r.cells[4].textContent,
		Cycle: r.classList.contains("cycle"), Indent: parseFloat(getComputedStyle(r.cells[0]).paddingLeft),
		CycleMarkerShown: r.cells[5].textContent.includes("cycle")}))`))
	if err != nil {
		t.Fatal(err)
	}
	want := []step{
		{Depth: "1", Who: "second@host-b", Lock: "ledger/eu", By: "fourth@host-d", How: "holding it"},
		{Depth: "2", Who: "fourth@host-d", Lock: "ledger/us", By: "<i>fifth</i>@host-e", How: "holding it"},
	}
	for i, w := range want {
		got := steps[i]
		if got.Depth != w.Depth || got.Who != w.Who || got.Lock != w.Lock || got.By != w.By || got.How != w.How || got.Cycle != w.Cycle || got.CycleMarkerShown != w.CycleMarkerShown || got.Since == "" || got.Since == "–" {
			t.Errorf("chain row %d: %+v, want %+v (and a wait time)", i, got, w)
		}
	}
	if len(steps) == 2 && !(steps[1].Indent > steps[0].Indent) {
		t.Errorf("depth 2 indented %vpx, depth 1 %vpx: want it further in", steps[1].Indent, steps[0].Indent)
	}
	// Markup from the server stays text: no element made of it anywhere.
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("main img, main i").length`)); err != nil || n != 0 {
		t.Fatalf("%d elements made of lock names or owners (%v); want none", n, err)
	}
	// The view is in the URL (bookmarkable), and its close button hides it.
	u, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		t.Fatal(err)
	}
	if pu, err := url.Parse(u); err != nil || pu.Query().Get("explain") != xssName {
		t.Errorf("URL %s (%v): want explain=%s", u, err, xssName)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`document.getElementById("explain-close").click()`)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the view closed", `document.getElementById("explain-section").hidden && !location.search.includes("explain")`)
}

// TestDashboardExplainReleaseAsked: after RequestRelease on a held lock,
// the Explain view (opened by ?explain=NAME) shows the holder's pending
// request, its reason as text and the revoke countdown of the lock's
// grace, and the lock row says it was asked.
func TestDashboardExplainReleaseAsked(t *testing.T) {
	srv := lockdtest.New(t)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}
	const name, reason = "deploy/prod", "<b>hotfix</b> needs it"
	s := c.session("deployer@host-a", time.Minute)
	c.acquire(&lockdv1.AcquireRequest{SessionId: s, Seq: 1, Name: name})
	// A revoke grace on the lock: the request (an admin's: no --auth-file
	// here) revokes the holder's session an hour later.
	if _, err := c.svc.SetLockPolicy(context.Background(), connect.NewRequest(&lockdv1.SetLockPolicyRequest{Name: name, Policy: &lockdv1.LockPolicy{RevokeGrace: durationpb.New(time.Hour)}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.svc.RequestRelease(context.Background(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: name, Reason: reason})); err != nil {
		t.Fatal(err)
	}
	ex, err := c.svc.Explain(context.Background(), connect.NewRequest(&lockdv1.ExplainRequest{Name: name}))
	if err != nil {
		t.Fatal(err)
	}
	if hs := ex.Msg.GetLock().GetHolders(); len(hs) != 1 || hs[0].GetReleaseRequestedAt() == nil || hs[0].GetRevokeGrace().AsDuration() != time.Hour {
		t.Fatalf("the server's holders: %v, want one, asked, with a grace of 1h", hs)
	}

	ctx := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL()+"/ui/?refresh=300&explain="+url.QueryEscape(name))); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the pending request and its reason", fmt.Sprintf(`(() => { const c = document.querySelector(".explain-holders tbody tr td.release"); return c && c.textContent.startsWith("asked ") && c.querySelector(".reason") && c.querySelector(".reason").textContent === %q; })()`, reason))
	poll(t, ctx, "the revoke countdown", `/revoke in (59m|1h)/.test(document.querySelector(".explain-holders td.release").textContent)`)
	poll(t, ctx, "the request in the lock row", fmt.Sprintf(`document.querySelector('tr[data-lock=%q] .holder').textContent.includes("asked to let go")`, name))
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("main b").length - document.querySelectorAll("main td > b, main .holder > b").length`)); err != nil || n != 0 {
		t.Fatalf("%d <b> elements made of the reason (%v); want none", n, err)
	}
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(".explain-holders td.release").textContent`)); err != nil || !strings.Contains(got, reason) {
		t.Fatalf("release cell %q (%v)", got, err)
	}
}
