package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// maxRequestBytes bounds one request body.
const maxRequestBytes = 64 << 10

// ClusterIDHeader is set on every API response to the cluster's id.
const ClusterIDHeader = "Lockd-Cluster-Id"

// Handler returns the HTTP handler of the node: the Connect API, /metrics,
// /healthz and /readyz.
func (s *Server) Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	path, h := lockdv1connect.NewLockServiceHandler(&api{s}, connect.WithReadMaxBytes(maxRequestBytes), connect.WithCompressMinBytes(4096), connect.WithInterceptors(s.metrics.interceptor()))
	mux.Handle(path, h)
	path, h = lockdv1connect.NewClusterServiceHandler(&clusterAPI{s}, connect.WithReadMaxBytes(maxRequestBytes), connect.WithInterceptors(s.metrics.interceptor()))
	mux.Handle(path, h)
	if g != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /v1/snapshot", s.serveSnapshot)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if why := s.notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := s.fsm.ClusterID(); id != "" {
			w.Header().Set(ClusterIDHeader, id)
		}
		mux.ServeHTTP(w, r)
	})
}

// serveSnapshot writes a consistent backup of the state (the FSM snapshot
// format) after a linearizable read on the leader; a follower redirects to
// the leader.
func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	url, err := s.leaderURL(r.Header)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if url != "" {
		http.Redirect(w, r, url+r.URL.Path, http.StatusTemporaryRedirect)
		return
	}
	if err := s.linearizable(); err != nil {
		http.Error(w, s.raftError(err).Error(), http.StatusServiceUnavailable)
		return
	}
	b, err := fsm.EncodeSnapshot(s.fsm.State())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

// api implements lockdv1connect.LockServiceHandler.
type api struct{ s *Server }

var _ lockdv1connect.LockServiceHandler = (*api)(nil)

func (a *api) clusterID() string { return a.s.fsm.ClusterID() }

// propose proposes a command and maps both Raft and FSM refusals.
func (a *api) propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error) {
	r, err := a.s.propose(t, m)
	if err != nil {
		return nil, a.s.raftError(err)
	}
	if r.Code != fsm.OK {
		return nil, a.s.resultError(r)
	}
	return r, nil
}

func (a *api) createSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	m := req.Msg
	ttl := a.s.cfg.DefaultTTL
	if m.Ttl != nil {
		if err := m.Ttl.CheckValid(); err != nil {
			return nil, a.s.invalid("ttl: %v", err)
		}
		ttl = m.Ttl.AsDuration()
	}
	if ttl < a.s.cfg.MinTTL || ttl > a.s.cfg.MaxTTL {
		return nil, a.s.invalid("ttl %v is outside the accepted range [%v, %v]", ttl, a.s.cfg.MinTTL, a.s.cfg.MaxTTL)
	}
	if ttl%time.Millisecond != 0 {
		ttl = ttl.Truncate(time.Millisecond)
	}
	if len(m.Owner) > fsm.MaxOwnerBytes {
		return nil, a.s.invalid("owner is %d bytes, more than %d", len(m.Owner), fsm.MaxOwnerBytes)
	}
	if len(m.RequestId) > fsm.MaxRequestIDBytes {
		return nil, a.s.invalid("request_id is %d bytes, more than %d", len(m.RequestId), fsm.MaxRequestIDBytes)
	}
	r, err := a.propose(fsm.CmdCreateSession, &fsmv1.CreateSession{
		RequestId: m.RequestId, SessionId: randomID(16), TtlMs: ttl.Milliseconds(), Owner: m.Owner, TimeUnixNano: time.Now().UnixNano(),
	})
	if err != nil {
		return nil, err
	}
	info, ok := a.s.fsm.Session(r.SessionID)
	if ok {
		ttl = info.TTL
	}
	return connect.NewResponse(&lockdv1.CreateSessionResponse{SessionId: r.SessionID, Ttl: durationpb.New(ttl), ClusterId: a.clusterID()}), nil
}

func (a *api) keepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	received := time.Now()
	if req.Msg.SessionId == "" {
		return nil, a.s.invalid("session_id is required")
	}
	// Leadership must be verified after the request was received, or a
	// deposed leader could extend a lease the new leader already expired;
	// and in the term whose leases this node runs (see linearizable).
	if err := a.s.linearizable(); err != nil {
		return nil, a.s.raftError(err)
	}
	ttl, err := a.s.lease.KeepAlive(req.Msg.SessionId, received)
	if err != nil {
		return nil, a.s.leaseError(err)
	}
	a.s.metrics.keepAlives.Inc()
	return connect.NewResponse(&lockdv1.KeepAliveResponse{Ttl: durationpb.New(ttl), ClusterId: a.clusterID()}), nil
}

func (a *api) closeSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	if req.Msg.SessionId == "" {
		return nil, a.s.invalid("session_id is required")
	}
	if _, err := a.propose(fsm.CmdCloseSession, &fsmv1.CloseSession{SessionId: req.Msg.SessionId, Seq: req.Msg.Seq}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.CloseSessionResponse{}), nil
}

func (a *api) read(c lockdv1.ReadConsistency) error {
	if c == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return nil
	}
	if err := a.s.linearizable(); err != nil {
		return a.s.raftError(err)
	}
	return nil
}

func (a *api) listSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	if err := a.read(req.Msg.Consistency); err != nil {
		return nil, err
	}
	resp := &lockdv1.ListSessionsResponse{}
	for _, x := range a.s.fsm.Sessions() {
		resp.Sessions = append(resp.Sessions, &lockdv1.SessionInfo{
			SessionId: x.ID, Owner: x.Owner, Ttl: durationpb.New(x.TTL),
			CreatedAt: timestamppb.New(x.CreatedAt), Holds: uint32(x.Holds), Waits: uint32(x.Waits), Revoked: x.Revoked,
		})
	}
	return connect.NewResponse(resp), nil
}

func (a *api) checkRequest(session string, seq uint64) error {
	if session == "" {
		return a.s.invalid("session_id is required")
	}
	if seq == 0 {
		return a.s.invalid("seq must be positive (per-session request sequence number)")
	}
	return nil
}

func (a *api) acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	mode := int32(m.Mode)
	switch m.Mode {
	case lockdv1.Mode_MODE_UNSPECIFIED:
		mode = fsm.ModeExclusive
	case lockdv1.Mode_MODE_EXCLUSIVE, lockdv1.Mode_MODE_SHARED:
	default:
		return nil, a.s.invalid("unknown mode %d", m.Mode)
	}
	if len(m.Value) > fsm.MaxValueBytes {
		return nil, a.s.invalid("value is %d bytes, more than %d", len(m.Value), fsm.MaxValueBytes)
	}
	poll := a.s.cfg.MaxPollTimeout
	if m.PollTimeout != nil {
		if err := m.PollTimeout.CheckValid(); err != nil || m.PollTimeout.AsDuration() < 0 {
			return nil, a.s.invalid("poll_timeout must be a non-negative duration")
		}
		poll = min(poll, m.PollTimeout.AsDuration())
	}
	// A waiter blocked on a leader that is deposed would not hear of a grant
	// the new leader makes (this node may never apply it): end the wait on
	// any leadership change, and the client repeats the same request on the
	// new leader, which answers from its state.
	changed := a.s.leadershipChanges()
	var delay time.Duration
	if m.LockDelay != nil {
		if err := m.LockDelay.CheckValid(); err != nil || m.LockDelay.AsDuration() < 0 || m.LockDelay.AsDuration().Milliseconds() > fsm.MaxLockDelayMs {
			return nil, a.s.invalid("lock_delay must be a duration from 0 to 1h")
		}
		delay = m.LockDelay.AsDuration()
	}
	r, err := a.propose(fsm.CmdAcquire, &fsmv1.Acquire{
		SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Mode: mode, Limit: m.Limit,
		Wait: m.Wait, Value: m.Value, TimeUnixNano: time.Now().UnixNano(), LockDelayMs: delay.Milliseconds(),
	})
	if err != nil {
		return nil, err
	}
	resp := &lockdv1.AcquireResponse{ClusterId: a.clusterID()}
	if r.Status == fsm.StatusGranted {
		resp.Status, resp.Token = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, r.Token
		return connect.NewResponse(resp), nil
	}
	// Queued (now or by the first attempt of this request): wait for the
	// grant, the drop, the poll timeout or the caller, whichever is first.
	key := waitKey{m.SessionId, m.Name, m.Seq}
	ch, stop := a.s.waiters.watch(key)
	defer stop()
	status, token, pos := a.s.fsm.WaitState(m.SessionId, m.Name, m.Seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token
		return connect.NewResponse(resp), nil
	case 0:
		return nil, a.dropped(m.SessionId, m.Name)
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	select {
	case o := <-ch:
		if o.dropped {
			return nil, a.dropped(m.SessionId, m.Name)
		}
		resp.Status, resp.Token = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, o.token
		return connect.NewResponse(resp), nil
	case <-timer.C:
	case <-ctx.Done():
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, ctx.Err())
	case <-a.s.done:
		return nil, a.s.raftError(raft.ErrRaftShutdown)
	case <-changed:
		return nil, a.s.raftError(raft.ErrLeadershipLost)
	}
	status, token, pos = a.s.fsm.WaitState(m.SessionId, m.Name, m.Seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token
	case fsm.StatusQueued:
		resp.Status, resp.Position = lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED, pos
	default:
		return nil, a.dropped(m.SessionId, m.Name)
	}
	return connect.NewResponse(resp), nil
}

// dropped explains a wait that ended without a grant: the session is gone
// (lease lost), the lock's job was completed, or the wait was cancelled.
func (a *api) dropped(session, name string) error {
	info, ok := a.s.fsm.Session(session)
	if !ok {
		return a.s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session expired or closed while waiting")
	}
	if info.Revoked {
		return a.s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, "session was force-released while waiting")
	}
	if l, ok := a.s.fsm.Describe(name); ok && l.Mark != nil {
		return a.s.resultError(&fsm.Result{Code: fsm.CodeAlreadyDone, Msg: fmt.Sprintf("the job of lock %q was completed while waiting", name), Mark: l.Mark})
	}
	return a.s.apiError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED, "the wait was cancelled")
}

func (a *api) release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	if _, err := a.propose(fsm.CmdRelease, &fsmv1.Release{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Token: m.Token, TimeUnixNano: time.Now().UnixNano()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.ReleaseResponse{}), nil
}

func (a *api) cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	r, err := a.propose(fsm.CmdCancel, &fsmv1.Cancel{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, AcquireSeq: m.AcquireSeq, TimeUnixNano: time.Now().UnixNano()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.CancelResponse{Released: r.Released}), nil
}

func (a *api) complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	if m.Retention == nil || m.Retention.CheckValid() != nil {
		return nil, a.s.invalid("retention is required (1s to 400 days)")
	}
	ret := m.Retention.AsDuration()
	if ret < time.Second || ret.Milliseconds() > fsm.MaxRetentionMs {
		return nil, a.s.invalid("retention %v is outside [1s, 400 days]", ret)
	}
	if _, err := a.propose(fsm.CmdComplete, &fsmv1.Complete{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Token: m.Token,
		RetentionMs: ret.Milliseconds(), TimeUnixNano: time.Now().UnixNano()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.CompleteResponse{}), nil
}

func (a *api) checkToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, err
	}
	h, ok := a.s.fsm.CheckToken(req.Msg.Name, req.Msg.Token)
	resp := &lockdv1.CheckTokenResponse{Valid: ok}
	if ok {
		resp.Mode, resp.SessionId = lockdv1.Mode(h.Mode), h.Session
	}
	return connect.NewResponse(resp), nil
}

func holdersPB(hs []fsm.HolderInfo) []*lockdv1.Holder {
	out := make([]*lockdv1.Holder, len(hs))
	for i, h := range hs {
		out[i] = &lockdv1.Holder{SessionId: h.Session, Mode: lockdv1.Mode(h.Mode), Token: h.Token, GrantedAt: timestamppb.New(h.GrantedAt), Value: h.Value, Owner: h.Owner}
	}
	return out
}

func markPB(m fsm.Mark) *lockdv1.Mark {
	return &lockdv1.Mark{SessionId: m.Session, Owner: m.Owner, Token: m.Token,
		CompletedAt: timestamppb.New(m.CompletedAt), Retention: durationpb.New(m.Retention)}
}

func lockPB(l fsm.LockInfo) *lockdv1.LockInfo {
	li := &lockdv1.LockInfo{Name: l.Name, Limit: l.Limit, Holders: holdersPB(l.Holders)}
	if l.Mark != nil {
		li.Mark = markPB(*l.Mark)
	}
	if l.Delay > 0 {
		li.LockDelay = durationpb.New(l.Delay)
		li.Delayed = l.Delayed
	}
	for _, w := range l.Waiters {
		li.Waiters = append(li.Waiters, &lockdv1.Waiter{SessionId: w.Session, Mode: lockdv1.Mode(w.Mode), QueuedAt: timestamppb.New(w.QueuedAt), Owner: w.Owner})
	}
	return li
}

func (a *api) describeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	if err := a.read(req.Msg.Consistency); err != nil {
		return nil, err
	}
	resp := &lockdv1.DescribeLockResponse{}
	if l, ok := a.s.fsm.Describe(req.Msg.Name); ok {
		resp.Lock = lockPB(l)
	}
	return connect.NewResponse(resp), nil
}

func (a *api) listLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	m := req.Msg
	n := int(m.PageSize)
	switch {
	case n == 0:
		n = 100
	case n > 1000:
		return nil, a.s.invalid("page_size %d is above 1000", n)
	}
	if len(m.Prefix) > fsm.MaxNameBytes || len(m.PageToken) > fsm.MaxNameBytes {
		return nil, a.s.invalid("prefix or page_token longer than %d bytes", fsm.MaxNameBytes)
	}
	if err := a.read(m.Consistency); err != nil {
		return nil, err
	}
	locks, more := a.s.fsm.List(m.Prefix, m.PageToken, n)
	resp := &lockdv1.ListLocksResponse{}
	for _, l := range locks {
		resp.Locks = append(resp.Locks, lockPB(l))
	}
	if more && len(locks) > 0 {
		resp.NextPageToken = locks[len(locks)-1].Name
	}
	return connect.NewResponse(resp), nil
}

func (a *api) forceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.invalid("%v", err)
	}
	if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, err
	}
	l, ok := a.s.fsm.Describe(req.Msg.Name)
	resp := &lockdv1.ForceReleaseResponse{}
	if !ok || len(l.Holders) == 0 {
		return connect.NewResponse(resp), nil
	}
	for _, h := range l.Holders {
		resp.SessionIds = append(resp.SessionIds, h.Session)
	}
	a.s.log.Warn("force release", "lock", req.Msg.Name, "sessions", resp.SessionIds, "unsafe_now", req.Msg.UnsafeNow)
	if req.Msg.UnsafeNow {
		for _, id := range resp.SessionIds {
			if _, err := a.propose(fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: id, TimeUnixNano: time.Now().UnixNano()}); err != nil {
				return nil, err
			}
		}
		return connect.NewResponse(resp), nil
	}
	if _, err := a.propose(fsm.CmdRevokeSession, &fsmv1.RevokeSession{SessionIds: resp.SessionIds, TimeUnixNano: time.Now().UnixNano()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (a *api) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	s := a.s
	info := s.fsm.Info()
	_, leader := s.raft.LeaderWithID()
	resp := &lockdv1.StatusResponse{
		NodeId: s.nodeID, Leader: string(leader), State: s.raft.State().String(), Term: s.raft.CurrentTerm(),
		CommitIndex: s.raft.CommitIndex(), AppliedIndex: s.raft.AppliedIndex(),
		Sessions: uint32(info.Sessions), Locks: uint32(info.Locks), ClusterId: info.ClusterID, LastToken: info.LastToken, Version: s.version,
	}
	resp.Members = s.members()
	return connect.NewResponse(resp), nil
}
