package guard

import (
	"errors"
	"log/slog"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// testDeps are a guard's dependencies on a real, empty FSM.
func testDeps() Deps {
	return Deps{
		NodeID: "n1",
		Log:    slog.New(slog.DiscardHandler),
		State:  fsm.New(nil),
		APIError: func(code connect.Code, reason lockdv1.ErrorReason, msg string) *connect.Error {
			return connect.NewError(code, errors.New(msg))
		},
		StreamError: func(err error) *lockdv1.StreamError {
			return &lockdv1.StreamError{Code: uint32(connect.CodeOf(err)), Message: err.Error()}
		},
		LimitHits:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hits"}, []string{"reason"}),
		AuthReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"outcome"}),
		Registerer:  prometheus.NewRegistry(),
	}
}

// testGuard is a guard without authentication whose limiter has the
// default limits def.
func testGuard(t testing.TB, def auth.Limits) *Guard {
	g, err := New(Config{}, testDeps())
	if err != nil {
		t.Fatal(err)
	}
	g.limits = g.newLimiter(def)
	return g
}
