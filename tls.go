package lockd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"github.com/lockd-dev/lockd/internal/certs"

	"github.com/lockd-dev/lockd/internal/wire"
)

// This file is the client's TLS: the options, and the transports' TLS
// settings. A Client configured for TLS reaches an endpoint written without
// a scheme ("host:port") over https, and the default endpoint is
// https://127.0.0.1:7070.

// WithTLSConfig makes the Client speak TLS with tc (a copy is kept): its
// RootCAs verify the servers (the cluster CA, or the system roots when
// nil) and its Certificates or GetClientCertificate authenticate the
// client. The session stream runs over HTTP/2 on TLS. It excludes
// WithHTTPClient and WithTLSFiles.
func WithTLSConfig(tc *tls.Config) Option {
	return func(c *config) error {
		if tc == nil {
			return fmt.Errorf("%w: nil tls config", ErrInvalidArgument)
		}
		if c.tlsFiles != nil {
			return fmt.Errorf("%w: WithTLSConfig and WithTLSFiles exclude each other", ErrInvalidArgument)
		}
		c.tlsConfig = tc.Clone()
		return nil
	}
}

// WithTLSFiles makes the Client speak TLS with PEM files: ca verifies the
// servers (empty: the system roots), cert and key (both or neither) are the
// client's certificate for servers that ask for one. The files are read
// in New (an error there matches ErrInvalidArgument) and read again when
// they change, so a renewed certificate is used by the next new
// connection. It excludes WithHTTPClient and WithTLSConfig.
func WithTLSFiles(ca, cert, key string) Option {
	return func(c *config) error {
		if c.tlsConfig != nil {
			return fmt.Errorf("%w: WithTLSConfig and WithTLSFiles exclude each other", ErrInvalidArgument)
		}
		st, err := certs.Load(certs.Files{CA: ca, Cert: cert, Key: key}, nil)
		if err != nil {
			return fmt.Errorf("%w: tls files: %w", ErrInvalidArgument, err)
		}
		c.tlsFiles = st
		return nil
	}
}

// tlsOn reports whether the Client speaks TLS.
func (c *config) tlsOn() bool { return c.tlsConfig != nil || c.tlsFiles != nil }

// checkTLS rejects TLS options combined with WithHTTPClient, and gives
// endpoints written without a scheme the https scheme.
func (c *config) checkTLS() error {
	if !c.tlsOn() {
		return nil
	}
	if c.httpClient != nil {
		return fmt.Errorf("%w: WithHTTPClient excludes the TLS options (configure TLS in the HTTP client)", ErrInvalidArgument)
	}
	if len(c.rawEndpoints) == 0 {
		c.endpoints = []string{"https://127.0.0.1:7070"}
		return nil
	}
	c.endpoints = c.endpoints[:0]
	for _, raw := range c.rawEndpoints {
		n, err := normalizeEndpointScheme(raw, "https")
		if err != nil {
			return err
		}
		c.endpoints = appendNew(c.endpoints, n)
	}
	return nil
}

// setTLS configures the transport t for TLS with the given ALPN protocols.
func (c *config) setTLS(t *http.Transport, protos []string) {
	switch {
	case c.tlsFiles != nil:
		// The handshake runs over t.DialContext, read at dial time, so
		// that the connection tracker (internal/wire), installed after this,
		// sees the TCP connection beneath TLS and net/http gets the
		// *tls.Conn itself (resp.TLS set, HTTP/2 by ALPN).
		st := c.tlsFiles
		t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialTLS(ctx, t.DialContext, st, network, addr, protos)
			if err != nil {
				return nil, err // not a nil *tls.Conn in a non-nil interface
			}
			return conn, nil
		}
	case c.tlsConfig != nil:
		t.TLSClientConfig = c.tlsConfig.Clone()
	}
}

// dialTLS dials addr with dial (a net.Dialer's when nil) and completes a
// TLS handshake with st's current material (certs.Store.ClientConfig: the
// files read again when they change), within ctx.
func dialTLS(ctx context.Context, dial wire.DialFunc, st *certs.Store, network, addr string, protos []string) (*tls.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	raw, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	conn := tls.Client(raw, st.ClientConfig(host, protos))
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return conn, nil
}
