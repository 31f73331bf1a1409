package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	lockdapi "github.com/lockd-dev/lockd/internal/api"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// refusing returns the stream handler of a node (no Raft: only the calls
// refused before reaching it may be served) with authentication, a
// flooder identity whose bucket is empty, the audit log on, and the
// context of a call of that identity and an Acquire frame.
func refusing(tb testing.TB) (lockdapi.TestHooks, context.Context, *lockdv1.StreamRequest) {
	path := filepath.Join(tb.TempDir(), "auth")
	rules := "token " + auth.HashToken("t") + " flooder\ngrant flooder lock\nlimit flooder rate=0.0001 burst=1\n"
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		tb.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := &Server{fsm: fsm.New(nil), log: slog.New(slog.DiscardHandler), nodeID: "n1"}
	s.api = lockdapi.New(lockdapi.Deps{Log: s.log, NodeID: s.nodeID, Parts: node.Parts{FSM: s.fsm, LockMetrics: node.NewLockMetrics(reg)}, Registerer: reg, Gatherer: reg})
	cfg := DefaultConfig()
	cfg.AuthFile, cfg.AuditLog = path, filepath.Join(tb.TempDir(), "audit.log")
	if err := s.openGuard(cfg, reg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.guard.Close() })
	s.api.Start(s.guard, nil, nil)
	// The caller's context as the guard's middleware makes it.
	var ctx context.Context
	r := httptest.NewRequest("POST", "/", nil)
	r.Host, r.RemoteAddr = "127.0.0.1:7070", "127.0.0.1:5000"
	r.Header.Set("Authorization", "Bearer t")
	s.guard.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ctx = r.Context() })).ServeHTTP(httptest.NewRecorder(), r)
	req := &lockdv1.StreamRequest{CallId: 7, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{SessionId: "s", Name: "hot", Secret: "x"}}}
	// Takes the one token.
	if err := s.guard.Run(ctx, req.GetAcquire(), "Acquire", func(context.Context) error { return nil }); err != nil {
		tb.Fatal(err)
	}
	return s.api.Hooks(), ctx, req
}

// BenchmarkRefusedFrame is the node's CPU for one session-stream frame
// refused by its identity's rate limit (the flood of acceptance 5), audit
// log on: guard, the refusal and its answer frame, without the transport
// and without the hold (guard.RefusalDelay: the caller has given up).
func BenchmarkRefusedFrame(b *testing.B) {
	h, ctx, req := refusing(b)
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	b.ReportAllocs()
	for b.Loop() {
		resp := h.ServeFrame(ctx, req, time.Now())
		if resp.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED {
			b.Fatalf("answer %v, want rate limited", resp)
		}
	}
}

// TestRateRefusalHeld checks that the answer to a session-stream frame
// over its rate limit is held guard.RefusalDelay, or until the stream ends.
func TestRateRefusalHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, ctx, req := refusing(t)
		start := time.Now()
		resp := h.ServeFrame(ctx, req, start)
		if resp.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED {
			t.Fatalf("answer %v, want rate limited", resp)
		}
		if d := time.Since(start); d != guard.RefusalDelay {
			t.Errorf("refusal answered after %v, want %v", d, guard.RefusalDelay)
		}

		ctx, cancel := context.WithTimeout(ctx, guard.RefusalDelay/4)
		defer cancel()
		start = time.Now()
		h.ServeFrame(ctx, req, start)
		if d := time.Since(start); d != guard.RefusalDelay/4 {
			t.Errorf("refusal of a call whose caller gave up after %v answered after %v", guard.RefusalDelay/4, d)
		}
	})
}
