package api

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/label"
	"github.com/lockd-dev/lockd/internal/node"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Session RPCs: create, keep alive, close, list.

// CreateSession creates a session with a TTL on the leader.
func (a *api) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.CreateSession, func() (*connect.Response[lockdv1.CreateSessionResponse], error) { return a.createSession(ctx, req) })
}

func (a *api) createSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	m := req.Msg
	ttl := a.s.cfg.DefaultTTL
	if m.Ttl != nil {
		if err := m.Ttl.CheckValid(); err != nil {
			return nil, a.s.errs.Invalid("ttl: %v", err)
		}
		ttl = m.Ttl.AsDuration()
	}
	if ttl < a.s.cfg.MinTTL || ttl > a.s.cfg.MaxTTL {
		return nil, a.s.errs.Invalid("ttl %v is outside the accepted range [%v, %v]", ttl, a.s.cfg.MinTTL, a.s.cfg.MaxTTL)
	}
	if ttl%time.Millisecond != 0 {
		ttl = ttl.Truncate(time.Millisecond)
	}
	// The lock names' rule: an owner is printed in admins' terminals. Here,
	// not in Apply, so that a node of an older version decides alike.
	if err := label.Check("owner", m.Owner); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	secret := m.Secret
	if secret == "" {
		secret = newSessionSecret()
	} else if len(secret) < minSecretBytes || len(secret) > maxSecretBytes {
		return nil, a.s.errs.Invalid("secret is %d bytes, not %d to %d", len(secret), minSecretBytes, maxSecretBytes)
	}
	cmd := &fsmv1.CreateSession{
		RequestId: m.RequestId, SessionId: node.RandomID(16), TtlMs: ttl.Milliseconds(), Owner: m.Owner,
		SecretHash: HashSecret(secret), Identity: guard.IdentityOf(ctx),
	}
	if err := fsm.ValidateCreateSession(cmd); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	sessionsCap, err := a.s.guard.CheckSessions(ctx)
	if err != nil {
		return nil, err
	}
	cmd.IdentitySessionsCap, cmd.TimeUnixNano = sessionsCap, wallclock.Now().UnixNano()
	r, err := a.propose(fsm.CmdCreateSession, cmd)
	if err != nil {
		return nil, err
	}
	if r.Duplicate && r.Secretless {
		// A retry found the session of its request id. Apply accepts any
		// secret for a session without one (restored from an old backup):
		// this answer must not hand it out.
		return nil, a.s.secretlessError(r.SessionID)
	}
	return connect.NewResponse(&lockdv1.CreateSessionResponse{SessionId: r.SessionID, Ttl: durationpb.New(r.TTL), ClusterId: a.clusterID(), Secret: secret}), nil
}

// KeepAlive extends a session's lease on the leader (not a Raft write).
func (a *api) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.KeepAlive, func() (*connect.Response[lockdv1.KeepAliveResponse], error) { return a.keepAlive(ctx, req) })
}

func (a *api) keepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	received := time.Now()
	if req.Msg.SessionId == "" {
		return nil, a.s.errs.Invalid("session_id is required")
	}
	// Leadership must be verified after the request was received, or a
	// deposed leader could extend a lease the new leader already expired;
	// and in the term whose leases this node runs (see linearizable).
	// The secret first: a refused call costs no VerifyLeader (keepalives
	// are not rate-limited).
	if err := a.s.checkSession(ctx, req.Msg.SessionId, req.Msg.Secret); err != nil {
		return nil, err
	}
	if err := a.s.node.Linearizable(); err != nil {
		return nil, a.s.errs.RaftError(err)
	}
	ttl, err := a.s.lease.KeepAlive(req.Msg.SessionId, received)
	if err != nil {
		return nil, a.s.errs.LeaseError(err)
	}
	a.s.metrics.keepAlives.Inc()
	return connect.NewResponse(&lockdv1.KeepAliveResponse{Ttl: durationpb.New(ttl), ClusterId: a.clusterID()}), nil
}

// CloseSession ends a session, releasing its holds and waits.
func (a *api) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.CloseSession, func() (*connect.Response[lockdv1.CloseSessionResponse], error) { return a.closeSession(ctx, req) })
}

func (a *api) closeSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	if req.Msg.SessionId == "" {
		return nil, a.s.errs.Invalid("session_id is required")
	}
	// Checked here too (Apply checks again) so that calls with a wrong
	// secret, or on a session that is gone, cost no log entry: CloseSession
	// is not rate-limited. On a leader whose term's barrier is done every
	// acknowledged session is applied, so an unknown one is already closed
	// (the answer Apply would give).
	if err := a.s.checkSession(ctx, req.Msg.SessionId, req.Msg.Secret); err != nil {
		return nil, err
	}
	if _, known := a.s.fsm.Session(req.Msg.SessionId); !known && a.s.node.PromotedTerm() != 0 {
		return connect.NewResponse(&lockdv1.CloseSessionResponse{}), nil
	}
	c := &fsmv1.CloseSession{SessionId: req.Msg.SessionId, Seq: req.Msg.Seq, SecretHash: HashSecret(req.Msg.Secret), Identity: guard.IdentityOf(ctx)}
	if a.s.fsm.ClusterVersion() >= 2 {
		c.TimeUnixNano = wallclock.Now().UnixNano() // the grant time of the waiters it lets in
	}
	if _, err := a.propose(fsm.CmdCloseSession, c); err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.CloseSessionResponse{}), nil
}

// sessionLockNames caps the lock names ListSessions gives per session.
const sessionLockNames = 16

// ListSessions lists the sessions.
func (a *api) ListSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.listSessions(ctx, req)
	}
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ListSessions, func() (*connect.Response[lockdv1.ListSessionsResponse], error) { return a.listSessions(ctx, req) })
}

func (a *api) listSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	if err := a.read(req.Msg.Consistency); err != nil {
		return nil, err
	}
	resp := &lockdv1.ListSessionsResponse{}
	for _, x := range a.s.fsm.Sessions() {
		pb := SessionPB(x)
		pb.Holding, pb.Waiting = a.s.fsm.SessionLocks(x.ID, sessionLockNames)
		if d, ok := a.s.lease.Deadline(x.ID); ok {
			pb.ExpiresAt = timestamppb.New(d)
		}
		resp.Sessions = append(resp.Sessions, pb)
	}
	return connect.NewResponse(resp), nil
}
