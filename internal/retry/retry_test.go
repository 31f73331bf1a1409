package retry

import (
	"testing"
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
