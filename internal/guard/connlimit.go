package guard

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The per-source connection cap of the API port (--max-conns-per-source):
// a listener wrapper that counts the open connections of each source IP
// address and closes a new one over the cap at once, before TLS or HTTP
// spend anything on it. Without it one source holding slow connections
// (each lives up to the 10 s header timeout, and is replaced as fast as it
// goes) took 15 300 of a node's file descriptors, and near the limit
// accept(2) failed for every client. The other members' addresses are not
// capped: a follower forwards each call in flight to the leader on a
// connection of its own (HTTP/1.1), so a busy follower may hold many.

// DefaultMaxConnsPerSource is the default cap of Listener (and of
// --max-conns-per-source). A Go client
// holds one to three connections to a node with the session stream (its
// upgraded connection, and HTTP/2 or HTTP/1.1 ones for the calls beside
// it), and in unary mode (HTTP/1.1) about one per call in flight; 512 leaves
// room for a few hundred client processes behind one NAT, or a unary
// client with hundreds of calls in flight, while one address holds at
// most 512 of the node's descriptors, a small share of any usual limit
// (Go raises the soft limit to the hard one: 20 000 to 1 048 576).
const DefaultMaxConnsPerSource = 512

// connCap is the capping listener.
type connCap struct {
	net.Listener
	max      int
	exempt   func(netip.Addr) bool // the other members' addresses
	onRefuse func(c net.Conn, open int)

	mu    sync.Mutex
	conns map[netip.Addr]int // open connections by source address
}

// newConnCap caps l at max connections per source address.
func newConnCap(l net.Listener, max int, exempt func(netip.Addr) bool, onRefuse func(net.Conn, int)) *connCap {
	return &connCap{Listener: l, max: max, exempt: exempt, onRefuse: onRefuse, conns: map[netip.Addr]int{}}
}

// SourceOf returns the IP address a connection comes from (an IPv4-mapped
// IPv6 address as IPv4) and its /64 key: the IPv4 address, or the IPv6
// /64, what one host usually holds. The API's connection cap counts by
// address (a cloud subnet is often one /64 shared by every client); the
// Raft port's handshake cap counts by /64 key (no client handshakes there,
// and members are spared by address).
func SourceOf(a net.Addr) (ip, key netip.Addr, ok bool) {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, netip.Addr{}, false
	}
	ip = ap.Addr().Unmap().WithZone("")
	key = ip
	if ip.Is6() {
		key = netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return ip, key, true
}

// Accept returns the next connection whose source is under its cap;
// the ones over it are closed here (with a reset: nothing of them stays
// on the node, not even TIME_WAIT) and never reach the HTTP server.
func (l *connCap) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip, _, ok := SourceOf(c.RemoteAddr())
		if !ok {
			return c, nil // not TCP/IP: nothing to count by
		}
		l.mu.Lock()
		n := l.conns[ip]
		l.mu.Unlock()
		if n >= l.max && !l.exempt(ip) {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
			l.onRefuse(c, n)
			continue
		}
		// Accept runs in one goroutine: no other connection was counted
		// meanwhile (closes only lower the count).
		l.mu.Lock()
		l.conns[ip]++
		l.mu.Unlock()
		return &cappedConn{Conn: c, l: l, ip: ip}, nil
	}
}

// open returns the connections counted for ip (tests).
func (l *connCap) open(ip netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[ip]
}

// cappedConn frees its slot when closed, however often Close is called.
type cappedConn struct {
	net.Conn
	l      *connCap
	ip     netip.Addr
	closed atomic.Bool
}

func (c *cappedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.mu.Lock()
		if c.l.conns[c.ip]--; c.l.conns[c.ip] <= 0 {
			delete(c.l.conns, c.ip)
		}
		c.l.mu.Unlock()
	}
	return c.Conn.Close()
}

// sparseLog writes a warning at most once per refusalLogEvery: the first at
// once, the next ones counted into the following line, so a flood of
// refusals cannot flood the log.
type sparseLog struct {
	log     *slog.Logger
	mu      sync.Mutex
	next    time.Time
	skipped int
}

func (l *sparseLog) warn(msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if now.Before(l.next) {
		l.skipped++
		l.mu.Unlock()
		return
	}
	n := l.skipped
	l.skipped, l.next = 0, now.Add(refusalLogEvery)
	l.mu.Unlock()
	l.log.Warn(msg, append(args, "refused_unlogged_before", n)...)
}
