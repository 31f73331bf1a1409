package guard

import (
	"context"
	"crypto/sha256"
	"net"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Access control, in one place: authenticate (an HTTP middleware in front
// of every handler) decides who the caller is; guard decides, per call,
// whether that caller may make it, counts it against the caller's limits
// and writes the audit log. The unary interceptor, each session-stream
// frame and the plain HTTP handlers (the backup download) all go through
// guard. With no auth file every identity is "" and everything is allowed;
// the session secret (secret.go) is checked in every mode.

// ForwardedHeader marks a request a follower forwarded to the leader. With
// authentication off it is the client's word: the guard uses it only so
// that the rate limit of the client's IP is not charged again.
const ForwardedHeader = "Lockd-Forwarded-By"

// ForwardedIdentityHeader carries the original caller's identity on a call
// a follower forwards to the leader. The leader believes it only from an
// authenticated peer (trustedPeer); from anyone else it is ignored.
const ForwardedIdentityHeader = "Lockd-Forwarded-Identity"

// caller is who made a request, as decided where it entered this node.
type caller struct {
	// identity is the caller's identity ("" with authentication off); for
	// a call forwarded by a trusted peer, the original caller's.
	identity string
	// known reports valid credentials (always false with auth off).
	known bool
	// addr is the network peer's address (a follower's, for a forwarded
	// call).
	addr string
	// forwardedBy is the peer identity that forwarded the call, if any.
	forwardedBy string
	// tlsPeer reports a cluster member's certificate (mutual TLS between
	// nodes): a peer whatever the auth file grants its identity.
	tlsPeer bool
	// forwarded reports, with authentication off, a call that says a
	// follower forwarded it (unverifiable: used only so that the rate
	// limit of the client's IP is not charged again, to the follower's).
	forwarded bool
	// byToken reports credentials from a bearer token: tokenHash is its
	// SHA-256 and tokenID the identity it named, so that a call judged
	// later than the request began (a stream's frames and events) is
	// refused once a reload removed the token (stillKnown).
	byToken   bool
	tokenHash [sha256.Size]byte
	tokenID   string
}

type callerKey struct{}

// callerOf returns the request's caller (zero when the request did not
// pass authenticate: in-process calls).
func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// IdentityOf returns the identity of the caller of the request in ctx, ""
// when authentication is off.
func IdentityOf(ctx context.Context) string { return callerOf(ctx).identity }

// authenticate puts the caller of each request in its context.
func (g *Guard) authenticate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, g.identify(r))))
	})
}

// identify decides a request's caller: the identity of its bearer token
// or, when it sends none, the name (common name) of its verified client
// certificate (TLS with --tls-client-auth verify-if-given or require). A
// token that the auth file does not know is refused even with a valid
// certificate: one credential is judged, never a mix.
func (g *Guard) identify(r *http.Request) caller {
	c := caller{addr: r.RemoteAddr}
	f := g.authFile()
	if f == nil {
		c.forwarded = r.Header.Get(ForwardedHeader) != ""
		return c
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	tok = strings.TrimSpace(tok)
	var id string
	var ok bool
	if tok != "" {
		h := auth.TokenKey(tok)
		if id, ok = f.Tokens[h]; ok {
			c.byToken, c.tokenHash, c.tokenID = true, h, id
		}
	}
	if g.d.TLSIdentity != nil {
		if name, peer, verified := g.d.TLSIdentity(r.TLS); verified {
			c.tlsPeer = peer
			if !ok && tok == "" && auth.ValidIdentity(name) {
				id, ok = name, true
			}
		}
	}
	if !ok {
		return c
	}
	c.identity, c.known = id, true
	if fwd := r.Header.Get(ForwardedIdentityHeader); fwd != "" && (c.tlsPeer || trustedPeer(f, id)) && auth.ValidIdentity(fwd) {
		c.identity, c.forwardedBy = fwd, id
	}
	return c
}

// trustedPeer reports whether the request comes from another lockd node,
// whose forwarded identities are believed: an identity with the peer
// grant. (A cluster member's certificate, caller.tlsPeer, is the other
// way; identify checks it.)
func trustedPeer(f *auth.File, identity string) bool {
	return f.Allows(identity, auth.Peer, "")
}

// stillKnown reports whether the caller's credentials are still those of
// its identity under the rules f: its token still names the same identity
// and, for a forwarded call, its forwarder is still a peer. identify
// checked them against the rules of when the request began; a stream is
// judged again after a reload.
func (c caller) stillKnown(f *auth.File) bool {
	if c.byToken {
		if id, ok := f.Tokens[c.tokenHash]; !ok || id != c.tokenID {
			return false
		}
	}
	return c.forwardedBy == "" || c.tlsPeer || trustedPeer(f, c.forwardedBy)
}

// PeerHeaders sets, on a call this node forwards, the original caller's
// identity (the forwarder's clients present this node's peer token).
func (g *Guard) PeerHeaders(ctx context.Context, h http.Header) {
	if g.peerToken == "" && g.d.TLS == nil {
		// No peer credential: the leader would ignore the header.
		return
	}
	if id := IdentityOf(ctx); id != "" {
		h.Set(ForwardedIdentityHeader, id)
	}
}

// access is what a call needs: a permission on a lock name or prefix.
type access struct {
	op     string // audit and metrics name
	perm   auth.Perm
	name   string // lock name or prefix; "" with anyName
	any    bool   // any grant of perm will do (session calls)
	admin  bool   // an admin operation: audited whatever its outcome
	member string // the member concerned, for the audit log
}

// accessOf maps a request message to what it needs, from its row of the
// method table (internal/rpcs); op names a call the table does not know
// (health), which any caller with valid credentials may make.
func accessOf(msg any, op string) *access {
	if _, ok := msg.(SnapshotRequest); ok {
		return &access{op: "SnapshotSave", perm: auth.Admin, admin: true}
	}
	pm, _ := msg.(proto.Message)
	m := rpcs.For(pm)
	if m == nil {
		return &access{op: op}
	}
	return &access{op: m.Name, perm: permOf[m.Perm], name: m.SubjectOf(pm), any: m.AnyName,
		admin: m.Perm == rpcs.Admin, member: m.MemberOf(pm)}
}

// permOf maps the table's permissions to the auth file's.
var permOf = [...]auth.Perm{rpcs.Open: 0, rpcs.Read: auth.Read, rpcs.Lock: auth.Lock, rpcs.Admin: auth.Admin}

// SnapshotRequest stands for GET /v1/snapshot in Run: an admin operation.
type SnapshotRequest struct{}

// allowed reports why the caller may not make the call, or nil.
func (g *Guard) allowed(ctx context.Context, a *access) *connect.Error {
	f := g.authFile()
	if f == nil {
		return nil
	}
	c := callerOf(ctx)
	if !c.known {
		return g.d.APIError(connect.CodeUnauthenticated, lockdv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED,
			"authentication required: send Authorization: Bearer <token> (lockd --token-file)")
	}
	if !c.stillKnown(f) {
		// A stream opened before a reload removed its token.
		return g.Denied("identity " + c.identity + ": " + errRevoked.Error() + " (its token or peer grant was removed)")
	}
	if a.perm == 0 {
		return nil
	}
	ok := false
	switch {
	case a.op == "Join":
		// A joining node presents its peer token.
		ok = c.tlsPeer || f.Allows(c.identity, auth.Admin, "") || f.Allows(c.identity, auth.Peer, "")
	case a.any && a.perm == auth.Lock:
		ok = f.AnyLock(c.identity)
	default:
		ok = f.Allows(c.identity, a.perm, a.name)
	}
	if !ok {
		what := a.perm.String()
		if a.name != "" {
			what += " on " + a.name
		}
		return g.Denied("identity " + c.identity + " may not " + a.op + " (" + what + " not granted)")
	}
	return nil
}

// Run runs one call for the caller in ctx: it checks access and the
// caller's limits, runs call, and writes the audit log (refusals, and
// every admin operation with its outcome). msg is the call's request
// message (SnapshotRequest for the backup download); op names a call the
// method table does not know. A refusal by the rate limit is a
// *LimitError.
func (g *Guard) Run(ctx context.Context, msg any, op string, call func(context.Context) error) error {
	a := accessOf(msg, op)
	if err := g.allowed(ctx, a); err != nil {
		g.audit.record(ctx, a, err)
		return err
	}
	release, err := g.limits.admit(ctx, msg)
	if err != nil {
		g.audit.limitRefused(ctx, a, err)
		return err
	}
	defer release()
	err = call(ctx)
	switch {
	case a.admin || connect.CodeOf(err) == connect.CodePermissionDenied:
		g.audit.record(ctx, a, err)
	case connect.CodeOf(err) == connect.CodeResourceExhausted:
		// The session and wait caps of the identity (limits.go), and
		// the refusals by Apply (the exact session cap, the table caps).
		g.audit.limitRefused(ctx, a, err)
	}
	return err
}

// Interceptor guards every unary call of the Connect services (Run), but
// the gRPC health and reflection services, open to all.
func (g *Guard) Interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if p := req.Spec().Procedure; strings.HasPrefix(p, "/grpc.health.") || strings.HasPrefix(p, "/grpc.reflection.") {
				// Open to all, like /healthz: load balancers and probes
				// carry no token, and the API's schema is public.
				return next(ctx, req)
			}
			var resp connect.AnyResponse
			op := req.Spec().Procedure
			if i := strings.LastIndexByte(op, '/'); i >= 0 {
				op = op[i+1:]
			}
			err := g.Run(ctx, req.Any(), op, func(ctx context.Context) error {
				var err error
				resp, err = next(ctx, req)
				return err
			})
			return resp, err
		}
	})
}

// hostOf returns the host part of a remote address.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// CheckLock refuses the caller in ctx unless it may lock name, for a call
// that names several locks (AcquireMany): its row needs only some lock
// grant, and the handler checks each name with this. The refusal is
// audited like the interceptor's.
func (g *Guard) CheckLock(ctx context.Context, op, name string) error {
	a := &access{op: op, perm: auth.Lock, name: name}
	if err := g.allowed(ctx, a); err != nil {
		g.audit.record(ctx, a, err)
		return err
	}
	return nil
}

// May reports whether the caller in ctx holds permission perm on lock name,
// for a handler whose call is open to a lesser permission but does more for
// a greater one (RequestRelease: lock to ask, admin to start the lock
// policy's revoke grace). Nothing is audited: it is a question, not a
// refusal. With authentication off every caller may do everything (as
// every call is allowed then, ForceRelease included).
func (g *Guard) May(ctx context.Context, perm rpcs.Perm, name string) bool {
	f := g.authFile()
	if f == nil {
		return true
	}
	c := callerOf(ctx)
	return c.known && c.stillKnown(f) && (perm == rpcs.Open || f.Allows(c.identity, permOf[perm], name))
}
