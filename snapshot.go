package lockd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/endpoint"

	"github.com/lockd-dev/lockd/internal/wire"
)

// snapshotTimeout bounds one attempt of a snapshot download, which carries
// the whole state and may take longer than a request.
const snapshotTimeout = time.Minute

// maxSnapshotBytes bounds a downloaded snapshot, held in memory until it is
// complete so that a failed attempt never leaves half a backup in dst.
const maxSnapshotBytes = 1 << 30

// Snapshot downloads a consistent backup of the cluster's state (what
// `lockd serve --restore` starts a new cluster from) and writes it to dst
// once it is complete. The server reads it on the leader; a follower
// redirects there. The download goes through the same endpoint failover,
// retries, cluster-id check and error mapping as every other call (an
// attempt may take up to a minute, within ctx); dst is written only after a
// whole snapshot arrived, so a failed call writes nothing.
func (c *Client) Snapshot(ctx context.Context, dst io.Writer) (int64, error) {
	var data []byte
	err := c.call.Do(ctx, wire.Policy{Idempotent: true, Timeout: snapshotTimeout}, "", func(ctx context.Context, n *wire.Node) error {
		b, err := c.download(ctx, n)
		if err != nil {
			return err
		}
		data = b
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	w, err := dst.Write(data)
	return int64(w), err
}

// errPlainRedirect is a redirect from https to http, refused so the token
// never travels in plaintext.
var errPlainRedirect = errors.New("plaintext redirect")

// download makes one snapshot attempt at n. Its errors are shaped like the
// API's (a *connect.Error with a code), so that the retry loop judges them
// the same way.
func (c *Client) download(ctx context.Context, n *wire.Node) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.URL+"/v1/snapshot", nil)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	c.authorize(req)
	// A follower redirects to the leader's API URL. Go drops the
	// Authorization header on a redirect to another host; the leader is
	// of the same cluster, so it gets the token again; but never over
	// plaintext when the call began over TLS (a misconfigured or hostile
	// node must not learn the token by redirecting to http).
	hc := *c.cfg.httpClient
	hc.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		if via[0].URL.Scheme == "https" && r.URL.Scheme != "https" {
			return fmt.Errorf("%w: refused redirect from %s to plaintext %s", errPlainRedirect, via[0].URL.Host, r.URL.Host)
		}
		c.authorize(r)
		return nil
	}
	resp, err := hc.Do(req)
	if errors.Is(err, errPlainRedirect) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err) // no retry heals it
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	defer resp.Body.Close()
	if err := c.eps.CheckCluster(n, resp.Header.Get(endpoint.ClusterIDHeader)); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		code := connect.CodeUnknown
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			code = connect.CodeUnavailable // no leader, or not established yet
		case resp.StatusCode == http.StatusUnauthorized:
			code = connect.CodeUnauthenticated
		case resp.StatusCode == http.StatusForbidden:
			code = connect.CodePermissionDenied
		case resp.StatusCode == http.StatusTooManyRequests:
			code = connect.CodeResourceExhausted
		case resp.StatusCode >= 400 && resp.StatusCode < 500:
			code = connect.CodeInvalidArgument
		}
		return nil, connect.NewError(code, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg)))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSnapshotBytes+1))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("read snapshot: %w", err))
	}
	if len(b) > maxSnapshotBytes {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("snapshot larger than 1 GiB"))
	}
	if resp.ContentLength >= 0 && int64(len(b)) != resp.ContentLength {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("snapshot cut short: %d of %d bytes", len(b), resp.ContentLength))
	}
	return b, nil
}
