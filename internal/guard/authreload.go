package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
)

// The auth file is read again without a restart, the way the certificates
// are (internal/certs): on SIGHUP (ReloadAuth), and when the file changed
// on disk, noticed by the requests themselves (a stat at most once per
// authCheckEvery, not a polling goroutine). A file that does not parse is
// logged and the previous rules stay in force: a bad edit never opens the
// node up. New rules apply to every call that starts after the swap; open
// streams wait on authRules.changed and judge their caller again (stream.go,
// watch.go), so a revoked token does not keep a stream working.

// authCheckEvery bounds how often a request stats the auth file to notice
// a change: a stat per request would cost more than the check it saves.
const authCheckEvery = time.Second

// authRules is one loaded auth file.
type authRules struct {
	file *auth.File
	// changed is closed when a reload replaces these rules.
	changed chan struct{}
}

// authReloader holds the current rules of an auth file. A nil
// *authReloader is authentication off.
type authReloader struct {
	path    string
	log     *slog.Logger
	reloads *prometheus.CounterVec // by outcome: ok, error

	cur   atomic.Pointer[authRules]
	epoch time.Time    // when the reloader started (monotonic clock)
	next  atomic.Int64 // when the next stat is due, in nanoseconds since epoch

	mu    sync.Mutex // one read of the file at a time
	stamp os.FileInfo
}

// newAuthReloader reads path; an error here stops the node from starting.
func newAuthReloader(path string, log *slog.Logger, reloads *prometheus.CounterVec) (*authReloader, error) {
	r := &authReloader{path: path, log: log, reloads: reloads, epoch: time.Now()}
	r.stamp, _ = os.Stat(path)
	f, err := auth.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r.cur.Store(&authRules{file: f, changed: make(chan struct{})})
	r.next.Store(int64(authCheckEvery))
	return r, nil
}

// rules returns the rules in force, first reading the file again when it
// changed on disk (checked at most once per authCheckEvery, by one caller
// while the others go on with the current rules).
func (r *authReloader) rules() *authRules {
	now := time.Since(r.epoch)
	if int64(now) >= r.next.Load() && r.mu.TryLock() {
		r.next.Store(int64(now + authCheckEvery))
		fi, _ := os.Stat(r.path) // a missing file shows as a change, then a read error
		if fileChanged(r.stamp, fi) {
			r.stamp = fi
			_ = r.readLocked("file changed")
		}
		r.mu.Unlock()
	}
	return r.cur.Load()
}

// reload reads the file now, whether or not it changed (SIGHUP).
func (r *authReloader) reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamp, _ = os.Stat(r.path)
	r.next.Store(int64(time.Since(r.epoch) + authCheckEvery))
	return r.readLocked("reload requested")
}

// readLocked reads and swaps in the file, or keeps the rules in force when
// it does not parse. Each outcome is logged and counted.
func (r *authReloader) readLocked(why string) error {
	f, err := auth.ReadFile(r.path)
	if err != nil {
		r.reloads.WithLabelValues("error").Inc()
		r.log.Error("auth file not reloaded: keeping the previous rules", "why", why, "err", err)
		return err
	}
	old := r.cur.Swap(&authRules{file: f, changed: make(chan struct{})})
	close(old.changed)
	r.reloads.WithLabelValues("ok").Inc()
	r.log.Info("auth file reloaded", "why", why, "path", r.path, "tokens", len(f.Tokens), "identities", len(f.Grants))
	return nil
}

// fileChanged reports whether a file's stat differs: another file (a new
// one renamed over it), another size or another modification time.
func fileChanged(old, now os.FileInfo) bool {
	if old == nil || now == nil {
		return old != now
	}
	return !os.SameFile(old, now) || old.Size() != now.Size() || !old.ModTime().Equal(now.ModTime())
}

// authFile returns the auth rules in force, nil when authentication is off.
func (g *Guard) authFile() *auth.File {
	if g.auth == nil {
		return nil
	}
	return g.auth.rules().file
}

// ReloadAuth reads the auth file again (SIGHUP). Calls that start after it
// returns use the new rules; open streams judge their caller again at once.
// A file that does not parse is an error and the previous rules stay in
// force. Without an auth file it does nothing.
func (g *Guard) ReloadAuth() error {
	if g.auth == nil {
		return nil
	}
	if err := g.auth.reload(); err != nil {
		return fmt.Errorf("reload auth file: %w", err)
	}
	return nil
}

// errRevoked is why an open stream ends after a reload took away its
// caller's access.
var errRevoked = errors.New("access revoked by an auth file reload")

// AuthWatch follows the auth rules for an open stream, whose caller was
// judged when it opened and is judged again when the rules change.
type AuthWatch struct {
	g   *Guard
	a   *access
	cur *authRules // nil: authentication off
}

// WatchAuth judges the caller in ctx for a stream of msg (op as in Run)
// and returns the watch that judges it again when the rules change. Take
// it after Run admitted the stream: rules swapped in between are caught
// here.
func (g *Guard) WatchAuth(ctx context.Context, msg any, op string) (AuthWatch, error) {
	aw := g.watchAuth(accessOf(msg, op))
	if err := g.allowed(ctx, aw.a); err != nil {
		return aw, err // not a nil *connect.Error in a non-nil error
	}
	return aw, nil
}

func (g *Guard) watchAuth(a *access) AuthWatch {
	if g.auth == nil {
		return AuthWatch{g: g, a: a}
	}
	return AuthWatch{g: g, a: a, cur: g.auth.rules()}
}

// Changed returns a channel closed when the rules are replaced (nil, never
// ready, with authentication off).
func (w *AuthWatch) Changed() <-chan struct{} {
	if w.cur == nil {
		return nil
	}
	return w.cur.changed
}

// Check judges the stream's caller again if the rules changed since the
// last check (reading the file first if it changed on disk and is due for
// a look).
func (w *AuthWatch) Check(ctx context.Context) error {
	if w.cur == nil {
		return nil
	}
	r := w.g.auth.rules()
	if r == w.cur {
		return nil
	}
	w.cur = r
	if err := w.g.allowed(ctx, w.a); err != nil {
		return err
	}
	return nil
}
