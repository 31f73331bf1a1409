package wire

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/rpcs"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// The session stream on its own upgraded HTTP/1.1 connection (the server
// side and the why: internal/api/upgrade.go). The client asks for the
// upgrade over its HTTP/1.1 transport; net/http hands over the connection
// when the server answers 101, and from then on the stream's Connect
// envelopes are written to it and read from it with no HTTP/2 framing. A
// server that answers anything else (an older one, or a proxy that does
// not pass upgrades) gets the stream over HTTP/2 as before.

// UpgradeHTTPClient returns the session service's HTTP client: the stream
// asks h1 for an upgraded connection first and goes to next (HTTP/2) when
// the server does not upgrade; every other request goes to next.
func UpgradeHTTPClient(h1, next connect.HTTPClient) connect.HTTPClient {
	return upgradeClient{h1: h1, next: next}
}

// upgradeClient is UpgradeHTTPClient's client.
type upgradeClient struct{ h1, next connect.HTTPClient }

// Do implements connect.HTTPClient.
func (c upgradeClient) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.GetBody != nil ||
		!strings.HasSuffix(req.URL.Path, lockdv1connect.SessionServiceStreamProcedure) {
		return c.next.Do(req)
	}
	up, err := http.NewRequestWithContext(req.Context(), http.MethodPost, req.URL.String(), nil)
	if err != nil {
		return nil, err
	}
	up.Header = req.Header.Clone()
	up.Header.Set("Connection", "Upgrade")
	up.Header.Set("Upgrade", rpcs.StreamUpgrade)
	resp, err := c.h1.Do(up)
	if err != nil {
		if req.Context().Err() != nil {
			return nil, err
		}
		// Not upgraded, for any reason (a kept-alive connection the
		// server had closed: net/http does not resend a POST; a
		// transport that will not send the header): the stream's body
		// has not been read, so HTTP/2 can still carry it, and decides
		// whether the endpoint has a stream at all.
		return c.next.Do(req)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok || !strings.EqualFold(resp.Header.Get("Upgrade"), rpcs.StreamUpgrade) {
		// Not upgraded: an older server, or a proxy. The stream's body
		// has not been read, so HTTP/2 can still carry it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		return c.next.Do(req)
	}
	markUpgraded(req.Context())
	resp.Header.Del("Connection")
	resp.Header.Del("Upgrade")
	// The connection is the stream's alone: it ends with the stream, and
	// so does the copy of the request body below (connect-go leaves its
	// request pipe open when the stream's context ends; closing the
	// pipe's reader ends a read waiting on it).
	end := func() {
		_ = req.Body.Close()
		_ = rwc.Close()
	}
	stop := context.AfterFunc(req.Context(), end)
	body := &envelopeBody{r: req.Body, more: moreHintOf(req.Context())}
	go func() {
		// One write per envelope, or per batch of envelopes sent together
		// (envelopeBody). The request side ends only when the client ends
		// the stream, so its end closes the connection (the server reads
		// that as the stream's end).
		_, _ = io.Copy(rwc, body)
		_ = req.Body.Close()
		_ = rwc.Close()
	}()
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK,
		Proto: "HTTP/2.0", ProtoMajor: 2, // a full-duplex stream, as HTTP/2's
		Header:        resp.Header, // the stream's: Connect's content type and encodings
		Body:          upgradedBody{bufio.NewReaderSize(rwc, 4<<10), stop, end},
		ContentLength: -1,
		Request:       req,
	}, nil
}

// upgradedBody is the stream's response body: the upgraded connection,
// read through a buffer (net/http's reads of an upgraded connection are
// unbuffered once what came with the 101 is read, and Connect reads an
// envelope's prefix and its message apart: two syscalls per answer),
// closed with it, and with it the copy of the request body.
type upgradedBody struct {
	*bufio.Reader
	stop func() bool
	end  func()
}

// Close implements io.Closer.
func (b upgradedBody) Close() error {
	b.stop()
	b.end()
	return nil
}
