package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// metricValue reads one sample line of the server's /metrics.
func metricValue(t *testing.T, url, sample string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// TestIdentityLimits: an identity over its rate, its session cap or its
// cap on waiting acquires gets RESOURCE_EXHAUSTED with the reason, each
// hit is counted by reason, and another identity is not affected.
func TestIdentityLimits(t *testing.T) {
	path := writeAuthFile(t, "limit billing-app rate=1 burst=3 sessions=2", "limit ops waits=1")
	srv := lockdtest.New(t, lockdtest.WithAuthFile(path))
	ctx := t.Context()
	billing := tokenClient(srv.URL(), billingToken, nil)
	admin := tokenClient(srv.URL(), adminToken, nil)

	// Sessions: two, then the cap (the bucket has 3 tokens).
	for i := range 2 {
		if _, err := billing.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)})); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
	}
	_, err := billing.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || reason(err) != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED || !strings.Contains(err.Error(), "sessions") {
		t.Fatalf("third session: %v, want resource exhausted (sessions)", err)
	}
	// Rate: the bucket is empty now (3 calls at 1/s).
	_, err = billing.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "rate limit") {
		t.Fatalf("fourth call: %v, want resource exhausted (rate)", err)
	}
	// Another identity is served.
	if _, err := admin.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"})); err != nil {
		t.Fatalf("admin while billing is limited: %v", err)
	}
	// Waits: ops may have one queued Acquire in flight.
	s1, err := admin.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := admin.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: s1.Msg.SessionId, Secret: s1.Msg.Secret, Seq: 1, Name: "w"})); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = admin.Acquire(wctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: s2.Msg.SessionId, Secret: s2.Msg.Secret, Seq: 1, Name: "w", Wait: true, PollTimeout: durationpb.New(30 * time.Second)}))
	})
	// The wait is in flight once the lock shows it queued (read by
	// another identity, so these reads use no token of ops' bucket).
	reader := tokenClient(srv.URL(), readerToken, nil)
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, err := reader.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "w"}))
		if err == nil && len(d.Msg.GetLock().GetWaiters()) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wait never queued: %v %v", d, err)
		}
	}
	_, err = admin.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: s1.Msg.SessionId, Secret: s1.Msg.Secret, Seq: 3, Name: "w", Wait: true}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("second wait: %v, want resource exhausted (waits)", err)
	}
	cancel()
	wg.Wait()
	for _, r := range []string{"rate", "sessions", "waits"} {
		if v := metricValue(t, srv.URL(), `lockd_limit_hits_total{reason="`+r+`"}`); v == "" || v == "0" {
			t.Errorf("lockd_limit_hits_total{reason=%q} = %q, want > 0", r, v)
		}
	}
}
