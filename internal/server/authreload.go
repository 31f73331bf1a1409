package server

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
func (s *Server) authFile() *auth.File {
	if s.auth == nil {
		return nil
	}
	return s.auth.rules().file
}

// ReloadAuth reads the auth file again (SIGHUP). Calls that start after it
// returns use the new rules; open streams judge their caller again at once.
// A file that does not parse is an error and the previous rules stay in
// force. Without --auth-file it does nothing.
func (s *Server) ReloadAuth() error {
	if s.auth == nil {
		return nil
	}
	if err := s.auth.reload(); err != nil {
		return fmt.Errorf("reload auth file: %w", err)
	}
	return nil
}

// errRevoked is why an open stream ends after a reload took away its
// caller's access.
var errRevoked = errors.New("access revoked by an auth file reload")

// authWatch follows the auth rules for an open stream, whose caller was
// judged when it opened and is judged again when the rules change.
type authWatch struct {
	s   *Server
	cur *authRules // nil: authentication off
}

func (s *Server) watchAuth() authWatch {
	if s.auth == nil {
		return authWatch{s: s}
	}
	return authWatch{s: s, cur: s.auth.rules()}
}

// changed returns a channel closed when the rules are replaced (nil, never
// ready, with authentication off).
func (w *authWatch) changed() <-chan struct{} {
	if w.cur == nil {
		return nil
	}
	return w.cur.changed
}

// check judges the stream's caller again for a if the rules changed since
// the last check (reading the file first if it changed on disk and is due
// for a look).
func (w *authWatch) check(ctx context.Context, a *access) error {
	if w.cur == nil {
		return nil
	}
	r := w.s.auth.rules()
	if r == w.cur {
		return nil
	}
	w.cur = r
	if err := w.s.allowed(ctx, a); err != nil {
		return err
	}
	return nil
}
