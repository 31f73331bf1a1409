package server_test

import (
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestSessionCapConcurrent: an identity's session cap holds exactly when
// its sessions are created concurrently: every creation passes the
// leader's check before any is applied, and Apply counts them one after
// another. The refusals are RESOURCE_EXHAUSTED and counted.
func TestSessionCapConcurrent(t *testing.T) {
	const limit, tries = 5, 60
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t, "limit billing-app sessions=5")), lockdtest.WithExactSessionCaps())
	ctx := t.Context()
	billing := tokenClient(srv.URL(), billingToken, nil)
	start := make(chan struct{})
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		ok, other int
	)
	for range tries {
		wg.Go(func() {
			<-start
			_, err := billing.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case connect.CodeOf(err) == connect.CodeResourceExhausted:
			default:
				other++
				t.Errorf("create session: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok != limit {
		t.Errorf("%d sessions created concurrently under a cap of %d", ok, limit)
	}
	reader := tokenClient(srv.URL(), readerToken, nil)
	ls, err := reader.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ls.Msg.Sessions); n != limit {
		t.Errorf("%d live sessions of billing-app, want %d", n, limit)
	}
	if v := metricValue(t, srv.URL(), `lockd_limit_hits_total{reason="sessions"}`); v != "55" {
		t.Errorf(`lockd_limit_hits_total{reason="sessions"} = %s, want 55`, v)
	}
}
