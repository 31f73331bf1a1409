package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Session secrets: CreateSession takes a secret from the client (or makes
// one) and the leader proposes only its SHA-256, so the log, snapshots and
// every replica keep the hash, never the secret. Each session-scoped call
// presents the secret; the leader hashes it into the command and Apply
// compares (fsm.authorize). KeepAlive is not a log command: the leader
// compares against the applied state (checkSession).

// Bounds on a session secret's length: at least 128 bits of a random
// 16-byte value, and small enough to keep requests small.
const (
	minSecretBytes = 16
	maxSecretBytes = 256
)

// HashSecret returns the SHA-256 of a session secret, as commands carry it.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// newSessionSecret makes a secret for a client that sent none (curl):
// 128 random bits, hex.
func newSessionSecret() string { return node.RandomID(16) }

// checkSession refuses a call on session id that does not present its
// secret or does not come from the identity that created it. An unknown
// session is left to the caller's own answer (not found).
func (s *Server) checkSession(ctx context.Context, id, secret string) error {
	hash, owner, ok := s.fsm.SessionAuth(id)
	if !ok {
		return nil
	}
	return s.checkSessionAuth(ctx, id, secret, hash, owner)
}

// checkSessionAuth is checkSession's test of a secret and the caller's
// identity against a session's read hash and owner.
func (s *Server) checkSessionAuth(ctx context.Context, id, secret string, hash []byte, owner string) error {
	if len(hash) == 0 {
		return s.secretlessError(id)
	}
	if subtle.ConstantTimeCompare(hash, HashSecret(secret)) != 1 {
		return s.guard.Denied("session " + id + ": wrong or missing session secret")
	}
	if owner != "" && owner != guard.IdentityOf(ctx) {
		return s.guard.Denied("session " + id + " belongs to another identity")
	}
	return nil
}

// refuseSecretless refuses a session-scoped call on a session without a
// secret hash, one restored from a backup written before session secrets.
// Apply would accept any secret for it (and must keep doing so: an older
// node decides the same); the leader's first act expires it
// (promoteTimers), and until that expiry commits the handlers refuse it
// here, before proposing, so nobody uses it meanwhile.
func (s *Server) refuseSecretless(id string) error {
	if hash, _, ok := s.fsm.SessionAuth(id); ok && len(hash) == 0 {
		return s.secretlessError(id)
	}
	return nil
}

func (s *Server) secretlessError(id string) error {
	return s.errs.APIError(connect.CodePermissionDenied, lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED,
		"session "+id+" has no secret (restored from a backup written before session secrets): it is revoked")
}
