package retry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	b := Backoff{Base: 50 * time.Millisecond, Cap: 2 * time.Second}
	for attempt := range 40 {
		ceiling := b.Cap
		if attempt < 6 {
			ceiling = min(b.Cap, b.Base<<attempt)
		}
		var sawHigh bool
		for range 200 {
			d := b.Delay(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("Delay(%d) = %v, want within [0, %v]", attempt, d, ceiling)
			}
			sawHigh = sawHigh || d > ceiling/2
		}
		if !sawHigh {
			t.Errorf("Delay(%d) never above half its ceiling %v: not full jitter", attempt, ceiling)
		}
	}
}

func TestRetrier(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Cap: time.Second}
	cause := errors.New("refused")

	t.Run("ctx ends: both causes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			r := New(ctx, b)
			n := 0
			for r.Next() {
				n++
				r.Fail(cause)
			}
			if err := r.Err(); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, cause) {
				t.Errorf("Err = %v, want the deadline and the last cause", err)
			}
			if n < 3 || n > 30 {
				t.Errorf("%d attempts in 3s, want backoff between them", n)
			}
		})
	})
	t.Run("gives up without a deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			r := New(context.Background(), b).GiveUpAfter(2 * time.Second)
			defer r.Stop()
			for r.Next() {
				r.Fail(cause)
			}
			if err := r.Err(); err != cause {
				t.Errorf("Err = %v, want the last cause alone", err)
			}
			if got := time.Since(start); got > 2*time.Second {
				t.Errorf("gave up after %v, want 2s", got)
			}
		})
	})
	t.Run("now, at most, wake", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			wake := make(chan struct{}, 1)
			r := New(t.Context(), Backoff{Base: time.Hour, Cap: time.Hour}).WakeOn(wake)
			r.Next()
			start := time.Now()
			r.Now()
			r.Next()
			r.AtMost(time.Millisecond)
			r.Next()
			wake <- struct{}{}
			r.Next()
			if got := time.Since(start); got > time.Millisecond {
				t.Errorf("waited %v, want at most 1ms", got)
			}
			if got := r.Attempt(); got != 3 {
				t.Errorf("Attempt = %d, want 3", got)
			}
		})
	})
}
