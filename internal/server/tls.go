package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// This file is the node's TLS: the checks of the TLS settings, the peer
// check of joins and forwarded calls on the API port, and the identity a
// client certificate names. The Raft port's mutual TLS is raftport.go.
// See docs/security.md, "TLS".

// validateTLS checks the TLS settings, and refuses a plaintext listener on
// an address other machines can reach unless Insecure says so.
func (c *Config) validateTLS() []error {
	var errs []error
	if c.TLS() && (c.TLSCert == "" || c.TLSKey == "" || c.TLSCA == "") {
		errs = append(errs, errors.New("tls needs --tls-cert, --tls-key and --tls-ca together (peers authenticate each other with the cluster ca)"))
	}
	if _, err := certs.ParseClientAuth(c.TLSClientAuth); err != nil {
		errs = append(errs, err)
	}
	if !c.TLS() && (c.TLSClientCA != "" || c.TLSClientAuth != "" && c.TLSClientAuth != "none") {
		errs = append(errs, errors.New("--tls-client-ca and --tls-client-auth need tls on (--tls-cert, --tls-key, --tls-ca)"))
	}
	if c.TLS() && strings.HasPrefix(strings.ToLower(c.Advertise), "http://") {
		errs = append(errs, fmt.Errorf("advertise %q: an http:// URL with tls on (want https:// or host:port)", c.Advertise))
	}
	if !c.TLS() && !c.Insecure {
		for _, l := range [][2]string{{"listen", c.Listen}, {"raft-listen", c.RaftListen}} {
			if !loopback(l[1]) {
				errs = append(errs, fmt.Errorf("%s %q is not a loopback address: serve it with tls (--tls-cert, --tls-key, --tls-ca) or, on a network you trust, pass --insecure", l[0], l[1]))
			}
		}
	}
	return errs
}

// loopback reports whether addr's host is a loopback address or
// "localhost": only this machine can connect to it.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true // a bad address is reported by its own check
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// openTLS loads the node's certificates when TLS is on, and warns loudly
// when it is off on an address other machines can reach.
func (s *Server) openTLS(cfg Config) error {
	if !cfg.TLS() {
		if !loopback(cfg.Listen) || !loopback(cfg.RaftListen) {
			s.log.Warn("INSECURE: serving without tls on a non-loopback address (--insecure): anyone who reaches these ports can take and release any lock and speak raft to this node",
				"listen", cfg.Listen, "raft_listen", cfg.RaftListen)
		}
		return nil
	}
	auth, err := certs.ParseClientAuth(cfg.TLSClientAuth)
	if err != nil {
		return err
	}
	s.clientAuth = auth
	s.tls, err = certs.Load(certs.Files{CA: cfg.TLSCA, Cert: cfg.TLSCert, Key: cfg.TLSKey, ClientCA: cfg.TLSClientCA,
		Check: (*certs.Material).CheckOwnMember}, s.log.With("component", "tls"))
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	return nil
}

// ReloadTLS reads the node's certificate, key and CA files again (SIGHUP).
// New connections use them; open ones keep theirs. Without TLS it does
// nothing. A changed file is also picked up by itself at the next
// handshake; ReloadTLS forces the read and reports an error.
func (s *Server) ReloadTLS() error {
	if s.tls == nil {
		return nil
	}
	if err := s.tls.Reload(); err != nil {
		return fmt.Errorf("reload tls: %w", err)
	}
	s.log.Info("tls certificates reloaded")
	return nil
}

// scheme is the scheme of this node's API URLs.
func (s *Server) scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// tlsListener wraps the API listener in TLS when it is on; HTTP/2 and
// HTTP/1.1 are both served (the session stream needs HTTP/2).
func (s *Server) tlsListener(l net.Listener) net.Listener {
	if s.tls == nil {
		return l
	}
	return tls.NewListener(l, s.tls.ServerConfig(s.clientAuth, []string{"h2", "http/1.1"}))
}

// requirePeer refuses, when TLS is on, a join or a forwarded call whose
// connection does not carry a certificate of a cluster member: only peers
// join, and only peers forward (the leader trusts what a forwarded call
// says about where it came from).
func (s *Server) requirePeer(next http.Handler) http.Handler {
	if s.tls == nil {
		return next
	}
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == lockdv1connect.ClusterServiceJoinProcedure || r.Header.Get(ForwardedHeader) != "" {
			if _, err := s.verifyPeer(r.TLS); err != nil {
				s.log.Warn("refused a join or forwarded call from a non-member", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
				ew.Write(w, r, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only cluster members may join or forward: %w", err)))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// verifyPeer checks that cs carries a cluster member's certificate
// (certs.Material.VerifyMember, the same rule as the Raft port's): one
// from the cluster CA naming both server and client authentication. A
// client certificate from the same CA, issued for client authentication
// only, is not a member's.
func (s *Server) verifyPeer(cs *tls.ConnectionState) (*x509.Certificate, error) {
	if cs == nil {
		return nil, errors.New("not a tls connection")
	}
	m := s.tls.Current()
	if len(cs.PeerCertificates) > 0 {
		if ok, err := s.peers.get(m, cs.PeerCertificates[0]); ok {
			return cs.PeerCertificates[0], err
		}
	}
	leaf, err := m.VerifyMember(cs.PeerCertificates)
	if len(cs.PeerCertificates) > 0 {
		s.peers.put(m, cs.PeerCertificates[0], err)
	}
	if err != nil {
		return nil, err
	}
	return leaf, nil
}

// peerCache remembers verifyPeer's answers per leaf certificate (one
// *x509.Certificate per connection) against one material: a follower
// forwards many calls on a connection, and a chain verification costs
// more than the rest of a forwarded call's handling. New material (a
// reload) starts it afresh.
type peerCache struct {
	mu      sync.Mutex
	m       *certs.Material
	answers map[*x509.Certificate]error
}

// maxPeerCache bounds the cache; it is emptied when full (its keys keep
// closed connections' certificates alive until then).
const maxPeerCache = 1024

// get returns the answer for leaf against m, if there is one.
func (c *peerCache) get(m *certs.Material, leaf *x509.Certificate) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m != m {
		return false, nil
	}
	err, ok := c.answers[leaf]
	return ok, err
}

// put records the answer for leaf against m.
func (c *peerCache) put(m *certs.Material, leaf *x509.Certificate, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m != m || len(c.answers) >= maxPeerCache {
		c.m, c.answers = m, map[*x509.Certificate]error{}
	}
	c.answers[leaf] = err
}

// TLSIdentity is who a verified client certificate names.
type TLSIdentity struct {
	// Name is the certificate's subject common name.
	Name string
	// DNSNames, URIs and Emails are its subject alternative names.
	DNSNames, URIs, Emails []string
	// Peer reports a cluster member's certificate (see verifyPeer): a
	// node, trusted with joins and forwarded calls.
	Peer bool
}

// TLSIdentity returns the identity named by the client certificate of a
// connection (an http.Request's TLS field), verified against the client
// CA or, for a peer, the cluster CA. It returns false for a plaintext
// connection, a connection without a client certificate, or a certificate
// no configured CA issued. It is the hook for authentication: a caller's
// identity from its certificate.
func (s *Server) TLSIdentity(cs *tls.ConnectionState) (TLSIdentity, bool) {
	if s.tls == nil || cs == nil || len(cs.PeerCertificates) == 0 {
		return TLSIdentity{}, false
	}
	leaf, err := s.verifyPeer(cs)
	peer := err == nil
	if !peer {
		if leaf, err = s.tls.Current().VerifyClient(cs.PeerCertificates); err != nil {
			return TLSIdentity{}, false
		}
	}
	id := TLSIdentity{Name: leaf.Subject.CommonName, DNSNames: leaf.DNSNames, Emails: leaf.EmailAddresses, Peer: peer}
	for _, u := range leaf.URIs {
		id.URIs = append(id.URIs, u.String())
	}
	return id, true
}
