package retry

import (
	"testing"
	"time"
)

func TestLeaseDeadline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		ttl  time.Duration
		want time.Duration // after sent
	}{
		{time.Second, time.Second - 10*time.Millisecond - 100*time.Millisecond},
		{2 * time.Second, 2*time.Second - 20*time.Millisecond - 100*time.Millisecond},
		{10 * time.Second, 10*time.Second - 100*time.Millisecond - 200*time.Millisecond},
		{time.Hour, time.Hour - 36*time.Second - 72*time.Second},
	}
	for _, tt := range tests {
		if got := LeaseDeadline(t0, tt.ttl).Sub(t0); got != tt.want {
			t.Errorf("ttl %v: deadline sent+%v, want sent+%v", tt.ttl, got, tt.want)
		}
		// Always strictly before the earliest server expiry (receive + TTL).
		if got := LeaseDeadline(t0, tt.ttl); !got.Before(t0.Add(tt.ttl)) {
			t.Errorf("ttl %v: deadline not before sent+TTL", tt.ttl)
		}
	}
}
