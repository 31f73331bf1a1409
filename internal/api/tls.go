package api

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

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
			if _, err := s.node.VerifyPeer(r.TLS); err != nil {
				s.log.Warn("refused a join or forwarded call from a non-member", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
				ew.Write(w, r, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only cluster members may join or forward: %w", err)))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
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
	leaf, err := s.node.VerifyPeer(cs)
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
