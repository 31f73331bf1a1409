package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/supervise"
)

// Release requests (RequestRelease, `lockd request-release`) reach lockd
// run through its session: it logs each one to stderr and, with
// --on-revoke=term, sends SIGTERM to the command's group. The command's own
// exit then releases the lock as usual; a command that ignores SIGTERM
// keeps the lock (until an admin's revoke grace, if any, revokes the
// session: then the lease-loss stop applies).

// On --on-revoke values.
const (
	onRevokeIgnore = "ignore"
	onRevokeTerm   = "term"
)

// checkOnRevoke validates --on-revoke.
func (f *runFlags) checkOnRevoke() error {
	switch f.onRevoke {
	case onRevokeIgnore:
		return nil
	case onRevokeTerm:
		if len(f.redis) > 0 {
			return fmt.Errorf("--on-revoke=term needs lockd: --backend redis has no release requests")
		}
		return nil
	}
	return fmt.Errorf("--on-revoke %q: want ignore or term", f.onRevoke)
}

// noticer is a held lockd lock that tells of release requests (Mutex,
// RWMutex, Semaphore, MultiLock).
type noticer interface {
	ReleaseRequested() <-chan lockd.ReleaseRequest
}

// releaseRequests returns the release requests of l's holds, nil on a
// backend without them.
func releaseRequests(l lease) <-chan lockd.ReleaseRequest {
	ll, ok := l.(*lockdLease)
	if !ok {
		return nil
	}
	n, ok := ll.lock.(noticer)
	if !ok {
		return nil
	}
	return n.ReleaseRequested()
}

// releaseRequested logs r and, with --on-revoke=term, sends SIGTERM to
// the command unless it was sent already (termSent: once per run, however
// many locks of a --lock set are asked, or a request starts a revoke grace
// later); it returns whether SIGTERM was sent by now.
func (c *RunCommand) releaseRequested(f *runFlags, proc *supervise.Process, r lockd.ReleaseRequest, termSent bool) bool {
	what := fmt.Sprintf("lockd: release of lock %q (token %d) requested", r.Name, r.Token)
	if r.Reason != "" {
		what += ": " + r.Reason
	}
	if r.RevokeGrace > 0 {
		what += fmt.Sprintf(" (the session is revoked at %s or later unless the lock is released)", r.RevokeAt.Format(time.RFC3339))
	}
	switch {
	case f.onRevoke == onRevokeTerm && termSent:
		fmt.Fprintf(c.Stderr, "%s; SIGTERM already sent to %s\n", what, f.command[0])
	case f.onRevoke == onRevokeTerm:
		fmt.Fprintf(c.Stderr, "%s; sending SIGTERM to %s\n", what, f.command[0])
		_ = proc.Signal(syscall.SIGTERM)
		return true
	default:
		fmt.Fprintf(c.Stderr, "%s; ignored (--on-revoke=ignore)\n", what)
	}
	return termSent
}
