package lockd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/internal/wire"
)

// This file tells a port that is not lockd's API from a server that failed,
// so that a client pointed at the wrong port (the Raft port, most often),
// or at a port where nothing listens, is told so at once instead of
// retrying for its whole timeout.

// probeTimeout bounds the check of whether an endpoint speaks HTTP at all.
const probeTimeout = time.Second

// notAPIFor is how long an endpoint found not to speak the API is passed
// over: long enough that calls do not retry it, short enough that a wrong
// verdict (a server that hung up on the probe for another reason) heals.
const notAPIFor = time.Minute

// refusedFor is how long a call goes on while every endpoint refuses the
// connection and no server has ever answered this Client, when a connect
// timeout is set: a server that is starting opens its port within it, and
// a stopped one never does, so waiting the whole connect timeout only
// hides the cause.
const refusedFor = time.Second

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

// mayProbe reports whether a failed attempt at ep is worth a probe: the
// connection was made but ended without HTTP (closed, reset, garbage, or
// the TLS protocols refused), and ep never answered this Client nor was
// probed lately. It records the probe.
func (c *Client) mayProbe(ep *node, err error) bool {
	if wire.ErrorDetail(err) != nil || errors.Is(err, ErrClusterMismatch) || wire.NotSent(err) || wire.IsRefused(err) {
		return false
	}
	if !wire.NotHTTP(err) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if ep.spoke || now.Before(ep.probed.Add(silentFor)) {
		return false
	}
	ep.probed = now
	return true
}

// probe asks ep for GET /readyz over HTTP/1.1 (the API answers it, with
// any status) and reports whether ep surely does not speak HTTP: it closed
// or reset the connection without a byte of HTTP, answered something that
// is not HTTP, or refused the API's TLS protocols (hashicorp/raft's
// transport reads the request as a Raft message and hangs up; with TLS the
// Raft port accepts only its own ALPN protocol). A probe that cannot
// connect, times out, is reset or gets any HTTP answer proves nothing: a
// node over its per-source connection cap resets new connections before
// reading them.
func (c *Client) probe(ctx context.Context, ep *node) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.url+"/readyz", nil)
	if err != nil {
		return false
	}
	req.Close = true
	resp, err := c.h1.Do(req)
	if err == nil {
		resp.Body.Close()
		return false
	}
	if ctx.Err() != nil || wire.NotSent(err) || wire.IsRefused(err) || errors.Is(err, syscall.ECONNRESET) {
		return false
	}
	return wire.NotHTTP(err)
}

// markNotAPI records that ep does not speak the API: calls pass it over
// for notAPIFor.
func (c *Client) markNotAPI(ep *node, cause error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ep.notAPI = &notAPIError{addr: hostOf(ep.url), cause: cause}
	ep.notUntil = time.Now().Add(notAPIFor)
	c.logger.Warn("endpoint does not speak the lockd API", "endpoint", ep.url)
	return ep.notAPI
}

// refusedAll reports whether every usable endpoint refused the connection
// during this call (refused), and whether no server has ever answered this
// Client.
func (c *Client) refusedAll(refused map[*node]error) (all, neverSpoke bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(refused) == 0 {
		return false, !c.spoke
	}
	now := time.Now()
	for _, ep := range c.eps {
		if ep.refused || ep.notAPI != nil && now.Before(ep.notUntil) {
			continue
		}
		if _, ok := refused[ep]; !ok {
			return false, !c.spoke
		}
	}
	return true, !c.spoke
}

// refusedErr returns the error of a call that every endpoint refused: it
// names them and wraps the last refusal of each.
func (c *Client) refusedErr(refused map[*node]error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := &refusedError{}
	for _, ep := range c.eps {
		if err, ok := refused[ep]; ok {
			e.urls = append(e.urls, ep.url)
			e.errs = append(e.errs, err)
		}
	}
	return e
}
