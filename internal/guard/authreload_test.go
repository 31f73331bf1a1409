package guard

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockd-dev/lockd/internal/auth"
)

// replaceFile writes b to path the way an operator should: a new file
// renamed over the old one, so no reader sees half of it.
func replaceFile(t *testing.T, path string, b string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestAuthReloadOnFileChange: the auth file is read again when it changes
// on disk, noticed by a call at most once per authCheckEvery; a file that
// does not parse, or is gone, keeps the rules in force.
func TestAuthReloadOnFileChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "auth")
		line := func(tok, id string) string {
			return "token " + auth.HashToken(tok) + " " + id + "\ngrant " + id + " read\n"
		}
		replaceFile(t, path, line("a", "alice"))
		reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"outcome"})
		r, err := newAuthReloader(path, slog.New(slog.DiscardHandler), reloads)
		if err != nil {
			t.Fatal(err)
		}
		knows := func(tok string) bool {
			_, ok := r.rules().file.Identify(tok)
			return ok
		}
		first := r.rules()
		replaceFile(t, path, line("b", "bob"))
		if !knows("a") || knows("b") {
			t.Fatal("the file was read again before authCheckEvery")
		}
		time.Sleep(authCheckEvery)
		if knows("a") || !knows("b") {
			t.Fatal("the changed file was not read after authCheckEvery")
		}
		select {
		case <-first.changed:
		default:
			t.Error("the replaced rules' changed channel is open")
		}
		replaceFile(t, path, "grant bob\n")
		time.Sleep(authCheckEvery)
		if !knows("b") {
			t.Fatal("a file that does not parse replaced the rules")
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		time.Sleep(authCheckEvery)
		if !knows("b") {
			t.Fatal("a removed file replaced the rules")
		}
		if ok, bad := testutil.ToFloat64(reloads.WithLabelValues("ok")), testutil.ToFloat64(reloads.WithLabelValues("error")); ok != 1 || bad != 2 {
			t.Errorf("reloads ok=%v error=%v, want 1 and 2", ok, bad)
		}
	})
}
