package guard

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/lockd-dev/lockd/internal/auth"
)

// Security is the access-control part of the node's configuration
// (docs/security.md). Every field maps to a `lockd serve` flag of the same
// name in kebab case.
type Security struct {
	// AuthFile turns authentication on: bearer tokens (stored as SHA-256),
	// their identities, per-prefix grants and per-identity limits. Empty:
	// authentication off (every call allowed; session secrets still
	// checked).
	AuthFile string
	// PeerTokenFile holds this node's own token (an identity with the peer
	// grant), presented when it forwards a call to the leader (with the
	// caller's identity) and when it joins. Needed in a cluster with
	// AuthFile.
	PeerTokenFile string
	// AuditLog is where the audit log goes: a file (appended), "-" for
	// stdout, "" for none.
	AuditLog string
	// RateLimit is each identity's sustained requests per second (token
	// bucket). 0: 10000 with AuthFile, none without (then, when set, it
	// applies per client IP address).
	RateLimit float64
	// RateBurst is the bucket's size. 0: twice RateLimit.
	RateBurst int
	// MaxSessionsPerIdentity caps an identity's live sessions (AuthFile
	// only). 0: 10000.
	MaxSessionsPerIdentity int
	// MaxWaitsPerIdentity caps an identity's queued Acquire calls in
	// flight (AuthFile only). 0: 10000.
	MaxWaitsPerIdentity int
	// MaxStreamsPerIdentity caps the streams (session streams and watches,
	// Connect and SSE) one identity has open on this node; for a caller
	// without valid credentials, per client IP address. 0: 64 with
	// AuthFile, none without (clients behind one NAT or proxy share an
	// address, so a per-address cap is the operator's choice); -1: no cap.
	MaxStreamsPerIdentity int
	// ExactSessionCaps makes the leader carry an identity's session cap in
	// CreateSession, so that Apply enforces it exactly. Off, the cap is
	// checked on the leader before proposing, and creations proposed
	// together can pass it together. Turn it on only once every node runs a
	// version that knows the field: an older node ignores it and would
	// create a session the others refuse (see docs/design.md, Mixed
	// versions).
	ExactSessionCaps bool
}

// defaultMaxStreams is MaxStreamsPerIdentity's default: far more than one
// client process opens (a session stream per node it talks to, and its
// watches), far fewer than would let one client exhaust a node.
const defaultMaxStreams = 64

// defaultLimits are the per-identity limits applied when neither the flags
// nor the auth file set them, with authentication on.
var defaultLimits = auth.Limits{Rate: 10000, Sessions: 10000, Waits: 10000}

func (g *Guard) openSecurity(c Security) error {
	def := auth.Limits{Rate: c.RateLimit, Burst: c.RateBurst, Sessions: c.MaxSessionsPerIdentity, Waits: c.MaxWaitsPerIdentity,
		Streams: c.MaxStreamsPerIdentity}
	if c.AuthFile != "" {
		r, err := newAuthReloader(c.AuthFile, g.d.Log.With("component", "auth"), g.d.AuthReloads)
		if err != nil {
			return err
		}
		g.auth = r
		def.Rate = orDefault(def.Rate, defaultLimits.Rate)
		def.Sessions = cmpInt(def.Sessions, defaultLimits.Sessions)
		def.Waits = cmpInt(def.Waits, defaultLimits.Waits)
		def.Streams = cmpInt(def.Streams, defaultMaxStreams)
	}
	if def.Burst == 0 {
		def.Burst = max(1, int(2*def.Rate))
	}
	g.limits = g.newLimiter(def)
	g.limits.exactCaps = c.ExactSessionCaps
	if c.PeerTokenFile != "" {
		b, err := os.ReadFile(c.PeerTokenFile)
		if err != nil {
			return fmt.Errorf("peer token: %w", err)
		}
		g.peerToken = strings.TrimSpace(string(b))
		if g.peerToken == "" {
			return errors.New("peer token file is empty")
		}
	}
	switch c.AuditLog {
	case "":
	case "-":
		g.audit = &auditLog{node: g.d.NodeID, w: os.Stdout}
	default:
		f, err := os.OpenFile(c.AuditLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		g.audit, g.auditFile = &auditLog{node: g.d.NodeID, w: f}, f
	}
	if g.auth == nil && g.audit != nil {
		g.d.Log.Warn("audit log without --auth-file: only refused session calls (wrong secret) and admin operations are recorded, all as identity \"\"")
	}
	return nil
}

func orDefault(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return v
}

func cmpInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
