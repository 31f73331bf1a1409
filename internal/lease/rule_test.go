package lease

import (
	"testing"
	"time"
)

func TestClientDeadline(t *testing.T) {
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
		if got := ClientDeadline(t0, tt.ttl).Sub(t0); got != tt.want {
			t.Errorf("ttl %v: deadline sent+%v, want sent+%v", tt.ttl, got, tt.want)
		}
		// Always strictly before the earliest server expiry (receive + TTL).
		if got := ClientDeadline(t0, tt.ttl); !got.Before(t0.Add(tt.ttl)) {
			t.Errorf("ttl %v: deadline not before sent+TTL", tt.ttl)
		}
	}
}

// TestRuleClientGivesUpFirst checks the invariant of the lease rule with
// both halves: for the same lease, the real time at which a client whose
// clock runs up to Drift slow reaches ClientDeadline is strictly before the
// server's expiry, whatever the transit delay and the grace.
func TestRuleClientGivesUpFirst(t *testing.T) {
	sent := time.Unix(1000, 0)
	ttls := []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		10 * time.Second, time.Minute, time.Hour, 24 * time.Hour}
	for _, ttl := range ttls {
		for _, transit := range []time.Duration{0, time.Millisecond, ttl / 2} {
			for _, grace := range []time.Duration{0, 100 * time.Millisecond, time.Second} {
				// Drift from none to the full allowance, in tenths.
				for tenth := range 11 {
					// A client clock slow by rate ρ measures (1 − ρ) of the
					// real time that passes.
					rho := float64(tenth) / 10 / driftDivisor
					onClient := ClientDeadline(sent, ttl).Sub(sent)
					real := time.Duration(float64(onClient) / (1 - rho))
					given := sent.Add(real)
					expiry := ServerExpiry(sent.Add(transit), ttl, grace)
					if !given.Before(expiry) {
						t.Errorf("ttl %v transit %v grace %v drift %.3f%%: client gives up at sent+%v, server may expire at sent+%v",
							ttl, transit, grace, rho*100, given.Sub(sent), expiry.Sub(sent))
					}
					// The margin is kept: at least max(100 ms, 2 % TTL) of
					// real time before sent + TTL even at full drift.
					if m := sent.Add(ttl).Sub(given); m < minMargin-time.Millisecond {
						t.Errorf("ttl %v drift %.3f%%: margin %v", ttl, rho*100, m)
					}
				}
			}
		}
	}
}

// TestRuleHoldClientGivesUpFirst: for a hold budget, the client's end
// (counted from a send before the grant, with its clock up to 1 % slow)
// comes strictly before the leader may end the hold (counted from when it
// applied the grant, or later from a new leader's establish time), with the
// margin kept.
func TestRuleHoldClientGivesUpFirst(t *testing.T) {
	sent := time.Unix(1000, 0)
	budgets := []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute, time.Hour, 720 * time.Hour}
	for _, b := range budgets {
		// Between the send and the leader's apply of the grant (a wait in
		// the queue, a leader change that restarts the budget later).
		for _, transit := range []time.Duration{0, time.Millisecond, b / 2, 10 * b} {
			for tenth := range 11 {
				rho := float64(tenth) / 10 / driftDivisor
				onClient := ClientHoldDeadline(sent, b).Sub(sent)
				given := sent.Add(time.Duration(float64(onClient) / (1 - rho)))
				end := ServerHoldEnd(sent.Add(transit), b)
				if !given.Before(end) {
					t.Errorf("budget %v transit %v drift %.3f%%: client gives up at sent+%v, server may end at sent+%v",
						b, transit, rho*100, given.Sub(sent), end.Sub(sent))
				}
				if m := sent.Add(b).Sub(given); m < minMargin-time.Millisecond {
					t.Errorf("budget %v drift %.3f%%: margin %v", b, rho*100, m)
				}
			}
		}
	}
}
