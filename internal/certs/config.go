package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// ClientAuth says what a node's API asks of a client's certificate.
type ClientAuth int

const (
	// ClientAuthNone accepts clients without a certificate. The handshake
	// still asks for one, unverified, so that peers can present theirs;
	// whoever needs it verifies it (VerifyPeer, VerifyClient).
	ClientAuthNone ClientAuth = iota
	// ClientAuthVerifyIfGiven refuses a client certificate that does not
	// verify, and accepts clients without one.
	ClientAuthVerifyIfGiven
	// ClientAuthRequire refuses clients without a certificate that
	// verifies against the client CA (or the cluster CA).
	ClientAuthRequire
)

// ParseClientAuth parses the value of --tls-client-auth: none,
// verify-if-given or require.
func ParseClientAuth(s string) (ClientAuth, error) {
	switch s {
	case "", "none":
		return ClientAuthNone, nil
	case "verify-if-given":
		return ClientAuthVerifyIfGiven, nil
	case "require":
		return ClientAuthRequire, nil
	}
	return 0, fmt.Errorf("tls-client-auth %q: want none, verify-if-given or require", s)
}

// minVersion is the oldest TLS version lockd speaks: every client of it is
// new enough for 1.2, and 1.0/1.1 are broken.
const minVersion = tls.VersionTLS12

// ServerConfig returns the tls.Config of a node's API listener. Each
// handshake uses the current material, so a reloaded certificate or CA
// applies to the next connection. nextProtos are the ALPN protocols
// served ("h2", "http/1.1").
func (s *Store) ServerConfig(auth ClientAuth, nextProtos []string) *tls.Config {
	mode := map[ClientAuth]tls.ClientAuthType{
		ClientAuthNone:          tls.RequestClientCert,
		ClientAuthVerifyIfGiven: tls.VerifyClientCertIfGiven,
		ClientAuthRequire:       tls.RequireAndVerifyClientCert,
	}[auth]
	return &tls.Config{
		MinVersion: minVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.Current()
			if m.Cert == nil {
				return nil, errors.New("no server certificate configured")
			}
			return &tls.Config{
				MinVersion:   minVersion,
				Certificates: []tls.Certificate{*m.Cert},
				ClientAuth:   mode,
				ClientCAs:    m.anyRoots,
				NextProtos:   nextProtos,
			}, nil
		},
	}
}

// PeerServerConfig returns the tls.Config of a node's Raft listener:
// mutual TLS, the peer's certificate verified against the cluster CA.
func (s *Store) PeerServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: minVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.Current()
			if m.Cert == nil || m.Roots == nil {
				return nil, errors.New("peer tls needs a certificate and the cluster ca")
			}
			return &tls.Config{
				MinVersion:   minVersion,
				Certificates: []tls.Certificate{*m.Cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.Roots,
				NextProtos:   []string{PeerProto},
			}, nil
		},
	}
}

// PeerProto is the ALPN protocol of Raft connections, so that a Raft
// connection cannot be mistaken for an API one or the reverse.
const PeerProto = "lockd-raft"

// ClientConfig returns a tls.Config for dialing serverName with the
// current material: the server verified against the cluster CA (the system
// roots without one), this side's certificate presented when there is one.
func (s *Store) ClientConfig(serverName string, nextProtos []string) *tls.Config {
	m := s.Current()
	c := &tls.Config{
		MinVersion: minVersion,
		ServerName: serverName,
		RootCAs:    m.Roots,
		NextProtos: nextProtos,
	}
	if m.Cert != nil {
		c.Certificates = []tls.Certificate{*m.Cert}
	}
	return c
}

// DialTLS dials addr over TCP and completes a TLS handshake with
// ClientConfig, within ctx. It fits http.Transport.DialTLSContext, so that
// every new connection of a long-lived transport uses the current files.
func (s *Store) DialTLS(ctx context.Context, network, addr string, nextProtos []string) (*tls.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: s.ClientConfig(host, nextProtos)}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// VerifyPeer checks that a connection's certificate chain was issued by
// the cluster CA for client authentication: the other side is a member of
// the cluster (or may become one). It returns the leaf.
func (m *Material) VerifyPeer(chain []*x509.Certificate) (*x509.Certificate, error) {
	return verify(chain, m.Roots, "cluster")
}

// VerifyClient checks that a connection's certificate chain was issued by
// the client CA (the cluster CA by default) for client authentication. It
// returns the leaf.
func (m *Material) VerifyClient(chain []*x509.Certificate) (*x509.Certificate, error) {
	return verify(chain, m.ClientRoots, "client")
}

func verify(chain []*x509.Certificate, roots *x509.CertPool, which string) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("no client certificate")
	}
	if roots == nil {
		return nil, fmt.Errorf("no %s ca configured", which)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, fmt.Errorf("certificate %q is not from the %s ca: %w", chain[0].Subject.CommonName, which, err)
	}
	return chain[0], nil
}
