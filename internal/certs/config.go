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
// mutual TLS, and the handshake itself fails unless the peer's certificate
// is a member's (VerifyMember), so that a non-member's connection never
// reaches Raft.
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
				// Any certificate is asked for; VerifyMember decides (a
				// chain verification for client authentication alone
				// would let a client certificate of the cluster CA in).
				ClientAuth:       tls.RequireAnyClientCert,
				VerifyConnection: m.verifyMemberConn,
				NextProtos:       []string{PeerProto},
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
	return s.Current().clientConfig(serverName, nextProtos)
}

func (m *Material) clientConfig(serverName string, nextProtos []string) *tls.Config {
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
	return s.dial(ctx, network, addr, nextProtos, false)
}

// DialPeer is DialTLS to another node: the handshake also fails unless
// the other side's certificate is a member's (VerifyMember), so that a
// node sends Raft RPCs, joins and forwarded calls only to members.
func (s *Store) DialPeer(ctx context.Context, network, addr string, nextProtos []string) (*tls.Conn, error) {
	return s.dial(ctx, network, addr, nextProtos, true)
}

func (s *Store) dial(ctx context.Context, network, addr string, nextProtos []string, member bool) (*tls.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	m := s.Current()
	c := m.clientConfig(host, nextProtos)
	if member {
		c.VerifyConnection = m.verifyMemberConn
	}
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: c}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return conn.(*tls.Conn), nil
}

// ErrNotMember is the error (wrapped) of a certificate that is not a
// cluster member's.
var ErrNotMember = errors.New("not a cluster member's certificate")

// VerifyMember checks that a connection's certificate chain is a cluster
// member's, and returns the leaf. It is the one rule of membership, on the
// Raft port (both ways) and for the API's peer-only calls (joins,
// forwarded calls): the chain verifies against the cluster CA (Roots, never
// the client CA) for both server and client authentication, and the
// leaf's extended key usages name both explicitly, as `lockd cert node`
// makes them. A client certificate (client authentication only) is not a
// member's, nor one without extended key usages (which would otherwise
// pass as any usage), nor one whose only usage is anyExtendedKeyUsage:
// that usage stands in for neither, because a CA that issues it to
// non-members would make them members.
func (m *Material) VerifyMember(chain []*x509.Certificate) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrNotMember)
	}
	leaf := chain[0]
	if _, err := verify(chain, m.Roots, "cluster", x509.ExtKeyUsageClientAuth); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if !hasUsage(leaf, x509.ExtKeyUsageServerAuth) || !hasUsage(leaf, x509.ExtKeyUsageClientAuth) {
		return nil, fmt.Errorf("%w: certificate %q does not name both server and client authentication among its extended key usages (a node certificate, as lockd cert node makes, does)", ErrNotMember, leaf.Subject.CommonName)
	}
	// The chain's CAs may narrow the usages too: verify it again for
	// server authentication.
	if _, err := verify(chain, m.Roots, "cluster", x509.ExtKeyUsageServerAuth); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	return leaf, nil
}

// CheckOwnMember checks that this node's own certificate is a member's
// (VerifyMember): a node whose certificate is not would refuse every peer's
// connection and have its own refused, and sit isolated with nothing but
// refusal lines in its log (a PKI whose node certificates name no
// extended key usage, say, which older lockd versions accepted).
func (m *Material) CheckOwnMember() error {
	if m.Cert == nil {
		return errors.New("no node certificate")
	}
	chain := make([]*x509.Certificate, 0, len(m.Cert.Certificate))
	for _, der := range m.Cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parse node certificate: %w", err)
		}
		chain = append(chain, c)
	}
	if _, err := m.VerifyMember(chain); err != nil {
		return fmt.Errorf("this node's own certificate would be refused by its peers (see docs/security.md, the member rule): %w", err)
	}
	return nil
}

// verifyMemberConn is VerifyMember as a tls.Config.VerifyConnection.
func (m *Material) verifyMemberConn(cs tls.ConnectionState) error {
	_, err := m.VerifyMember(cs.PeerCertificates)
	return err
}

func hasUsage(c *x509.Certificate, want x509.ExtKeyUsage) bool {
	for _, u := range c.ExtKeyUsage {
		if u == want {
			return true
		}
	}
	return false
}

// VerifyClient checks that a connection's certificate chain was issued by
// the client CA (the cluster CA by default) for client authentication. It
// returns the leaf.
func (m *Material) VerifyClient(chain []*x509.Certificate) (*x509.Certificate, error) {
	return verify(chain, m.ClientRoots, "client", x509.ExtKeyUsageClientAuth)
}

func verify(chain []*x509.Certificate, roots *x509.CertPool, which string, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
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
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return nil, fmt.Errorf("certificate %q does not verify against the %s ca for %s: %w", chain[0].Subject.CommonName, which, usageName(usage), err)
	}
	return chain[0], nil
}

func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "server authentication"
	case x509.ExtKeyUsageClientAuth:
		return "client authentication"
	}
	return fmt.Sprintf("usage %d", u)
}
