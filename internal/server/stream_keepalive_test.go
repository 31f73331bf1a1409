package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// keepAliveAllocsPerSession bounds the allocations of a keepalive batch's
// answer per session renewed: a stream carrying many sessions renews them
// all every round.
const keepAliveAllocsPerSession = 0.5

func TestKeepAliveBatchAllocationsPerSession(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	h := s.api.Hooks()
	const n = 200
	b := &lockdv1.KeepAliveBatch{}
	for range n {
		r, err := h.LockService().CreateSession(t.Context(), connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			t.Fatal(err)
		}
		b.Sessions = append(b.Sessions, &lockdv1.KeepAliveRequest{SessionId: r.Msg.GetSessionId(), Secret: r.Msg.GetSecret()})
	}
	ctx := context.Background()
	var failed error
	allocs := testing.AllocsPerRun(20, func() {
		resp, err := h.KeepAliveBatch(ctx, b, time.Now())
		if err != nil {
			failed = err
			return
		}
		for _, r := range resp.GetResults() {
			if r.GetError() != nil || r.GetTtl().AsDuration() != time.Minute {
				failed = fmt.Errorf("result %v, want a renewal for a minute", r)
			}
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if per := allocs / n; per > keepAliveAllocsPerSession {
		t.Fatalf("%.2f allocations per session renewed, want at most %v", per, keepAliveAllocsPerSession)
	} else {
		t.Logf("%.2f allocations per session renewed (%.0f per batch of %d)", per, allocs, n)
	}
}
