package lockd

import (
	"context"
	"errors"
	"net/http"
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

// refusedFor is how long a call goes on while every endpoint refuses the
// connection and no server has ever answered this Client, when a connect
// timeout is set: a server that is starting opens its port within it, and
// a stopped one never does, so waiting the whole connect timeout only
// hides the cause.
const refusedFor = time.Second

// probe asks ep for GET /readyz over HTTP/1.1 (the API answers it, with
// any status) and reports whether ep surely does not speak HTTP: it closed
// or reset the connection without a byte of HTTP, answered something that
// is not HTTP, or refused the API's TLS protocols (hashicorp/raft's
// transport reads the request as a Raft message and hangs up; with TLS the
// Raft port accepts only its own ALPN protocol). A probe that cannot
// connect, times out, is reset or gets any HTTP answer proves nothing: a
// node over its per-source connection cap resets new connections before
// reading them.
func (c *Client) probe(ctx context.Context, ep *wire.Node) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL+"/readyz", nil)
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
