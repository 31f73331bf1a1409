package wallclock

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The offset file moves Now at once, both ways, and an absent or bad file
// means no offset. Now carries no monotonic reading.
func TestOffsetFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "wall")
	near := func(got time.Time, off time.Duration) bool {
		d := got.Sub(time.Now().Round(0).Add(off))
		return d > -time.Second && d < time.Second
	}
	if d := offset(f); d != 0 {
		t.Errorf("no file: offset %v, want 0", d)
	}
	for _, tc := range []struct {
		text string
		want time.Duration
	}{{"5m", 5 * time.Minute}, {"-3m30s\n", -3*time.Minute - 30*time.Second}, {"garbage", 0}, {"", 0}} {
		if err := os.WriteFile(f, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		if d := offset(f); d != tc.want {
			t.Errorf("file %q: offset %v, want %v", tc.text, d, tc.want)
		}
	}
	if now := Now(); now != now.Round(0) || !near(now, 0) {
		t.Errorf("Now() = %v: want the wall clock without a monotonic reading", now)
	}
}
