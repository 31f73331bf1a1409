package server

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// refusing returns the stream handler of a node (no Raft: only the calls
// refused before reaching it may be served) with authentication, a
// flooder identity whose bucket is empty, the audit log on, and the
// context of a call of that identity and an Acquire frame.
func refusing(tb testing.TB) (*sessionAPI, context.Context, *lockdv1.StreamRequest) {
	path := filepath.Join(tb.TempDir(), "auth")
	rules := "token " + auth.HashToken("t") + " flooder\ngrant flooder lock\nlimit flooder rate=0.0001 burst=1\n"
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		tb.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, reg)
	rl, err := newAuthReloader(path, slog.New(slog.DiscardHandler), m.authReloads)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{auth: rl, metrics: m, fsm: fsm.New(nil)}
	s.limits = newLimiter(s, auth.Limits{})
	s.audit = &auditLog{node: "n1", w: io.Discard}
	ctx := context.WithValue(context.Background(), callerKey{}, caller{identity: "flooder", known: true, addr: "127.0.0.1:5000"})
	req := &lockdv1.StreamRequest{CallId: 7, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{SessionId: "s", Name: "hot", Secret: "x"}}}
	if _, err := s.limits.admit(ctx, req.GetAcquire()); err != nil { // takes the one token
		tb.Fatal(err)
	}
	return &sessionAPI{&api{s}}, ctx, req
}

// BenchmarkRefusedFrame is the node's CPU for one session-stream frame
// refused by its identity's rate limit (the flood of acceptance 5), audit
// log on: guard, the refusal and its answer frame, without the transport
// and without the hold (refusalDelay: the caller has given up).
func BenchmarkRefusedFrame(b *testing.B) {
	h, ctx, req := refusing(b)
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	b.ReportAllocs()
	for b.Loop() {
		resp := h.serve(ctx, req, time.Now())
		if resp.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED {
			b.Fatalf("answer %v, want rate limited", resp)
		}
	}
}

// TestRateRefusalHeld checks that the answer to a session-stream frame
// over its rate limit is held refusalDelay, or until the stream ends.
func TestRateRefusalHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, ctx, req := refusing(t)
		start := time.Now()
		resp := h.serve(ctx, req, start)
		if resp.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED {
			t.Fatalf("answer %v, want rate limited", resp)
		}
		if d := time.Since(start); d != refusalDelay {
			t.Errorf("refusal answered after %v, want %v", d, refusalDelay)
		}

		ctx, cancel := context.WithTimeout(ctx, refusalDelay/4)
		defer cancel()
		start = time.Now()
		h.serve(ctx, req, start)
		if d := time.Since(start); d != refusalDelay/4 {
			t.Errorf("refusal of a call whose caller gave up after %v answered after %v", refusalDelay/4, d)
		}
	})
}
