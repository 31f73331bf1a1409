package lockd

import (
	"context"
	"errors"
	"testing"
	"time"
)

type bindKey struct{}

// A call bound to its session ends when the session does, with the
// session's cause, whichever way bind made it: from a ctx that never ends
// (no context per call) or from one that can (a child context); the
// caller's values stay visible, and a context derived per attempt ends
// with it.
func TestBindEndsWithSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"background", func() (context.Context, context.CancelFunc) {
			return context.WithValue(context.Background(), bindKey{}, "v"), func() {}
		}},
		{"cancellable", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.WithValue(context.Background(), bindKey{}, "v"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Session{}
			s.ctx, s.cancel = context.WithCancelCause(context.Background())
			ctx, cancelCaller := tc.ctx()
			defer cancelCaller()
			bctx, stop := s.bind(ctx)
			defer stop()
			attempt, cancel := context.WithTimeout(bctx, time.Hour)
			defer cancel()
			if bctx.Value(bindKey{}) != "v" || attempt.Value(bindKey{}) != "v" {
				t.Error("the caller's value is lost")
			}
			if bctx.Err() != nil || attempt.Err() != nil {
				t.Fatal("ended before the session")
			}
			cause := errors.New("lease lost")
			s.cancel(cause)
			<-bctx.Done()
			<-attempt.Done()
			if !errors.Is(bctx.Err(), context.Canceled) || context.Cause(bctx) != cause || context.Cause(attempt) != cause {
				t.Errorf("Err %v, Cause %v and %v; want Canceled and the session's cause", bctx.Err(), context.Cause(bctx), context.Cause(attempt))
			}
		})
	}
}
