package node

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"sync/atomic"
	"time"
)

// Peers is what the node knows of the other members' addresses and
// certificates: TLS, the peer check, the members spared by the caps.
type Peers struct{ *Node }

// The other members' addresses, which the guard's per-source connection
// cap (internal/guard, Listener) and the Raft port's handshake caps spare:
// a follower forwards each call in flight to the leader on a connection
// of its own (HTTP/1.1), so a busy follower may hold many.

// peerRefresh is how often the names of the other members are resolved
// again.
const peerRefresh = 5 * time.Second

// peerAddrs holds the other members' addresses given as names, resolved
// every peerRefresh, so that a peer's connections are never capped. The
// ones given as IP literals (the usual case) are read at each check, so a
// member that has just joined is spared at once.
type peerAddrs struct {
	resolved atomic.Pointer[map[netip.Addr]bool]
}

// raftMember reports whether ip is another member's address, once Raft
// runs: the Raft port's handshake caps spare it.
func (s Peers) raftMember(ip netip.Addr) bool { return s.raftUp.Load() && s.IsPeer(ip) }

// IsPeer reports whether ip is the address of another member: a host in
// the Raft configuration or a member's API URL. It runs only for a
// connection over its cap (the Raft configuration is read without
// waiting on Raft).
func (s Peers) IsPeer(ip netip.Addr) bool {
	if m := s.peerAddrs.resolved.Load(); m != nil && (*m)[ip] {
		return true
	}
	for _, h := range s.peerHosts() {
		if a, err := netip.ParseAddr(h); err == nil && a.Unmap().WithZone("") == ip {
			return true
		}
	}
	return false
}

// peerHosts lists the hosts of the other members' Raft and API addresses.
func (s Peers) peerHosts() []string {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var hosts []string
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == s.nodeID {
			continue
		}
		if h, _, err := net.SplitHostPort(string(srv.Address)); err == nil {
			hosts = append(hosts, h)
		}
		if m, ok := s.fsm.Member(string(srv.ID)); ok {
			if u, err := url.Parse(m.API); err == nil && u.Hostname() != "" {
				hosts = append(hosts, u.Hostname())
			}
		}
	}
	return hosts
}

// resolvePeers keeps the resolved addresses of the members given by name
// current until the node closes.
func (s Peers) resolvePeers() {
	defer s.wg.Done()
	t := time.NewTicker(peerRefresh)
	defer t.Stop()
	for {
		set := map[netip.Addr]bool{}
		for _, h := range s.peerHosts() {
			if _, err := netip.ParseAddr(h); err == nil {
				continue // read at each check
			}
			// Bounded: Close waits for this goroutine.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
			cancel()
			if err != nil {
				s.log.Debug("member address not resolved: its connections are capped like a client's", "host", h, "err", err)
				continue
			}
			for _, ip := range ips {
				set[ip.Unmap().WithZone("")] = true
			}
		}
		s.peerAddrs.resolved.Store(&set)
		select {
		case <-t.C:
		case <-s.done:
			return
		}
	}
}

// ResolvePeers keeps the resolved addresses of the members given by name
// current until the node closes (IsPeer reads them), in the background.
func (s Peers) ResolvePeers() {
	s.wg.Add(1)
	go s.resolvePeers()
}
