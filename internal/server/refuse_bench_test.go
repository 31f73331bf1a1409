package server

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// BenchmarkRefusedFrame is the server's cost of one session-stream frame
// refused by its identity's rate limit (the flood of acceptance 5), audit
// log on: guard, the refusal and its answer frame, without the transport.
func BenchmarkRefusedFrame(b *testing.B) {
	f, err := auth.Parse([]byte("token " + auth.HashToken("t") + " flooder\ngrant flooder lock\nlimit flooder rate=0.0001 burst=1\n"))
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := &Server{auth: f, metrics: newMetrics(reg, reg), fsm: fsm.New(nil)}
	s.limits = newLimiter(s, f, auth.Limits{})
	s.audit = &auditLog{node: "n1", w: io.Discard}
	h := &sessionAPI{&api{s}}
	ctx := context.WithValue(context.Background(), callerKey{}, caller{identity: "flooder", known: true, addr: "127.0.0.1:5000"})
	req := &lockdv1.StreamRequest{CallId: 7, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{SessionId: "s", Name: "hot", Secret: "x"}}}
	if _, err := s.limits.admit(ctx, req.GetAcquire()); err != nil { // takes the one token
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		resp := h.serve(ctx, req, time.Now())
		if resp.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED {
			b.Fatalf("answer %v, want rate limited", resp)
		}
	}
}
