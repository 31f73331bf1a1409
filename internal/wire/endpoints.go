package wire

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Endpoints is the client's set of servers and the choice among them: the
// one to try next (the last that answered, or the leader a server named),
// which ones answered lately, refused, belong to another cluster or do not
// speak the API, and the cluster id the client saw first.
type Endpoints struct {
	mu        sync.Mutex
	eps       []*Node
	cur       int
	clusterID string
	spoke     bool // some endpoint answered a call once
	newNode   func(url string) *Node
	logger    *slog.Logger
}

// NewEndpoints returns the set of urls; newNode makes a Node for a URL
// (also for a leader a server names later). It starts at a random
// endpoint, so that many clients given the same list do not all wait on
// its first node when that one hangs.
func NewEndpoints(urls []string, newNode func(url string) *Node, logger *slog.Logger) *Endpoints {
	e := &Endpoints{newNode: newNode, logger: logger}
	for _, u := range urls {
		e.eps = append(e.eps, newNode(u))
	}
	e.cur = rand.IntN(len(e.eps))
	return e
}

// All returns the endpoints.
func (e *Endpoints) All() []*Node {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Node(nil), e.eps...)
}

// SetCurrent makes the i-th endpoint the next to try (tests that script
// the order).
func (e *Endpoints) SetCurrent(i int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cur = i
}

// ErrUnavailable means no endpoint could serve the call
// (lockd.ErrUnavailable).
var ErrUnavailable = errors.New("lockd: unavailable")

// Abandoned records that ep was abandoned (it did not answer a keepalive):
// it is passed over until it answers again or SilentFor passes.
func (e *Endpoints) Abandoned(ep *Node) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.silent = time.Now().Add(SilentFor)
	ep.abandon = true
	ep.leftAt = time.Now()
}

// maxEndpoints bounds the endpoint list, which grows when a server names a
// leader the client was not told about.
const maxEndpoints = 32

// SilentFor is how long an endpoint that did not answer (refused, broke
// or timed out) is passed over while another may be tried: a frozen node
// must not cost every call an attempt timeout.
const SilentFor = 10 * time.Second

// Node is one server (endpoint) the client may call. Its mutable fields are
// guarded by Endpoints.mu.
type Node struct {
	URL      string
	Svc      lockdv1connect.LockServiceClient // HTTP/1.1 (or WithHTTPClient's)
	Svc2     lockdv1connect.LockServiceClient // h2c, once a stream is open; nil without streams
	Sessions lockdv1connect.SessionServiceClient
	Cluster  lockdv1connect.ClusterServiceClient
	Stream   StreamSlot
	refused  bool      // answered another cluster's id
	silent   time.Time // did not answer; passed over until then
	spoke    bool      // answered a call (over HTTP) at least once
	probed   time.Time // last probed for HTTP (Caller.probe)
	notAPI   error     // does not speak the API (Caller.probe); passed over until notUntil
	notUntil time.Time
	abandon  bool      // abandoned (Caller.abandon) and has not answered since
	leftAt   time.Time // when it was last abandoned
}

// Unary returns the client for ep's unary calls: over the stream's
// connection once a stream is open there (HTTP/2 passes), else HTTP/1.1.
func (ep *Node) Unary() lockdv1connect.LockServiceClient {
	if ep.Svc2 != nil && ep.Stream.IsOpen() {
		return ep.Svc2
	}
	return ep.Svc
}

// Pick returns the endpoint to try next, and whether another usable one
// exists. It passes over endpoints of another cluster or that do not speak
// the API (their error when no other is left), and endpoints that
// did not answer lately unless every usable one is such (then the one
// silent longest goes first).
func (e *Endpoints) Pick() (*Node, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	var best *Node
	var notAPI error
	bestAt, usable := 0, 0
	for i := range e.eps {
		at := (e.cur + i) % len(e.eps)
		ep := e.eps[at]
		foreign := ep.notAPI != nil && now.Before(ep.notUntil)
		if foreign && notAPI == nil {
			notAPI = ep.notAPI
		}
		if ep.refused || foreign {
			continue
		}
		usable++
		better := best == nil ||
			best.silent.After(now) && (!ep.silent.After(now) || ep.silent.Before(best.silent))
		if better {
			best, bestAt = ep, at
		}
	}
	if best == nil && notAPI != nil {
		return nil, false, notAPI
	}
	if best == nil {
		return nil, false, fmt.Errorf("%w: every endpoint answered for a cluster other than %s", ErrClusterMismatch, e.clusterID)
	}
	e.cur = bestAt
	return best, usable > 1, nil
}

// Silent records that ep did not answer.
func (e *Endpoints) Silent(ep *Node) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.silent = time.Now().Add(SilentFor)
}

// Answered records that ep answered.
func (e *Endpoints) Answered(ep *Node) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.silent = time.Time{}
	ep.spoke, e.spoke = true, true
	ep.abandon = false
}

// Rotate moves past ep after it failed, unless another call already did.
func (e *Endpoints) Rotate(ep *Node) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.eps[e.cur] == ep {
		e.cur = (e.cur + 1) % len(e.eps)
	}
}

// Follow makes the leader named in a hint the next endpoint to try. It
// reports whether the hint named an endpoint other than from.
func (e *Endpoints) Follow(from *Node, hint string) bool {
	u, err := endpoint.Normalize(hint)
	if err != nil || u == from.URL {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, ep := range e.eps {
		if ep.URL == u {
			if ep.refused {
				return false
			}
			e.cur = i
			if !ep.abandon || time.Since(ep.leftAt) >= staleHintFor {
				ep.silent = time.Time{} // a server just saw it lead
			}
			return true
		}
	}
	if len(e.eps) >= maxEndpoints {
		return false
	}
	e.eps = append(e.eps, e.newNode(u))
	e.cur = len(e.eps) - 1
	e.logger.Info("leader endpoint added", "endpoint", u)
	return true
}

// CheckCluster records the first cluster id seen and refuses an endpoint
// that answers with another one.
func (e *Endpoints) CheckCluster(ep *Node, id string) error {
	if id == "" {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.clusterID == "" {
		e.clusterID = id
		return nil
	}
	if e.clusterID == id {
		return nil
	}
	if !ep.refused {
		ep.refused = true
		e.logger.Warn("endpoint refused", "endpoint", ep.URL, "cluster", id, "want_cluster", e.clusterID)
	}
	return fmt.Errorf("%w: %s answered for cluster %s, not %s", ErrClusterMismatch, ep.URL, id, e.clusterID)
}

// ClusterID returns the id of the cluster the client talks to, or "" before
// the first answer that carried one.
func (e *Endpoints) ClusterID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.clusterID
}

// notAPIFor is how long an endpoint found not to speak the API is passed
// over: long enough that calls do not retry it, short enough that a wrong
// verdict (a server that hung up on the probe for another reason) heals.
const notAPIFor = time.Minute

// notAPIError says that an endpoint accepted the connection but does not
// answer HTTP (or refused the API's TLS protocols): it is some other
// service, most likely a lockd node's Raft port. It matches ErrUnavailable
// and wraps what the call failed with.
type notAPIError struct {
	addr  string
	cause error
}

func (e *notAPIError) Error() string {
	return fmt.Sprintf("lockd: %s does not speak the lockd API (is it the Raft port? the API listens on --listen, 127.0.0.1:7070 by default)", e.addr)
}

func (e *notAPIError) Unwrap() []error { return []error{ErrUnavailable, e.cause} }

// refusedError says that every endpoint refused the connection: no server
// listens there. It matches ErrUnavailable and wraps each endpoint's error,
// so errors.Is(err, syscall.ECONNREFUSED) holds.
type refusedError struct {
	urls []string
	errs []error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("lockd: unavailable: connection refused by %s (nothing listening)", strings.Join(e.urls, ", "))
}

func (e *refusedError) Unwrap() []error { return append([]error{ErrUnavailable}, e.errs...) }

// hostOf returns the host:port of an endpoint URL.
func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Host
	}
	return u
}

// MayProbe reports whether a failed attempt at ep is worth a probe: the
// connection was made but ended without HTTP (closed, reset, garbage, or
// the TLS protocols refused), and ep never answered this Client nor was
// probed lately. It records the probe.
func (e *Endpoints) MayProbe(ep *Node, err error) bool {
	if ErrorDetail(err) != nil || errors.Is(err, ErrClusterMismatch) || NotSent(err) || IsRefused(err) {
		return false
	}
	if !NotHTTP(err) {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if ep.spoke || now.Before(ep.probed.Add(SilentFor)) {
		return false
	}
	ep.probed = now
	return true
}

// MarkNotAPI records that ep does not speak the API: calls pass it over
// for notAPIFor.
func (e *Endpoints) MarkNotAPI(ep *Node, cause error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ep.notAPI = &notAPIError{addr: hostOf(ep.URL), cause: cause}
	ep.notUntil = time.Now().Add(notAPIFor)
	e.logger.Warn("endpoint does not speak the lockd API", "endpoint", ep.URL)
	return ep.notAPI
}

// RefusedAll reports whether every usable endpoint refused the connection
// during this call (refused), and whether no server has ever answered this
// Client.
func (e *Endpoints) RefusedAll(refused map[*Node]error) (all, neverSpoke bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(refused) == 0 {
		return false, !e.spoke
	}
	now := time.Now()
	for _, ep := range e.eps {
		if ep.refused || ep.notAPI != nil && now.Before(ep.notUntil) {
			continue
		}
		if _, ok := refused[ep]; !ok {
			return false, !e.spoke
		}
	}
	return true, !e.spoke
}

// RefusedErr returns the error of a call that every endpoint refused: it
// names them and wraps the last refusal of each.
func (e *Endpoints) RefusedErr(refused map[*Node]error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := &refusedError{}
	for _, ep := range e.eps {
		if err, ok := refused[ep]; ok {
			r.urls = append(r.urls, ep.URL)
			r.errs = append(r.errs, err)
		}
	}
	return r
}

// reopenTimeout bounds opening a stream to an endpoint abandoned since it
// last answered: a live node opens one in milliseconds, and a call (an
// Acquire) sent there after a stale leader hint must not wait a whole
// request timeout on a node that is still frozen.
const reopenTimeout = time.Second

// staleHintFor is how long after abandoning a node the client does not
// let a leader hint naming it bring it back: a follower names a frozen
// leader until its own heartbeat timeout passes (400–800 ms at the
// servers' defaults) and an election starts, so such a hint is stale, and
// following it would send the calls straight back to the frozen node.
// Later hints are followed: a leader that was only slow to answer is
// found again in time for the sessions' leases.
const staleHintFor = time.Second

// OpenTimeout is how long opening a stream to ep may take: reopenTimeout
// for a node abandoned since it last answered, and for a node this client
// never heard from while another one answers it (a call moved there after
// a failure elsewhere, with no hint: that node may be the frozen leader
// the failure came from, and its hello, which a live node sends without
// Raft, would never come); the request timeout otherwise (a cold start on
// a busy machine).
func (e *Endpoints) OpenTimeout(ep *Node, requestTimeout time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ep.abandon || (e.spoke && !ep.spoke) {
		return min(requestTimeout, reopenTimeout)
	}
	return requestTimeout
}

// AbandonedLately reports whether ep was abandoned and has not answered
// since.
func (e *Endpoints) AbandonedLately(ep *Node) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return ep.abandon
}

// At picks the endpoint of a watch attempt: the client's current
// one first, then the others in turn. Any node serves a watch.
func (e *Endpoints) At(attempt int) *Node {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.eps[(e.cur+attempt)%len(e.eps)]
}
