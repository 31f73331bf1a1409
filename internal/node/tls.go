package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/lockd-dev/lockd/internal/certs"
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
func (s Peers) openTLS(cfg Config) error {
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
func (s Peers) ReloadTLS() error {
	if s.tls == nil {
		return nil
	}
	if err := s.tls.Reload(); err != nil {
		return fmt.Errorf("reload tls: %w", err)
	}
	s.log.Info("tls certificates reloaded")
	return nil
}

// Scheme is the scheme of this node's API URLs.
func (s Peers) Scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// VerifyPeer checks that cs carries a cluster member's certificate
// (certs.Material.VerifyMember, the same rule as the Raft port's): one
// from the cluster CA naming both server and client authentication. A
// client certificate from the same CA, issued for client authentication
// only, is not a member's.
func (s *Node) VerifyPeer(cs *tls.ConnectionState) (*x509.Certificate, error) {
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

// peerCache remembers VerifyPeer's answers per leaf certificate (one
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
