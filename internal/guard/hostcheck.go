package guard

import (
	"crypto/x509"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/certs"
)

// The Host/Origin check, in front of everything served on the API port and
// on the pprof listener: the defence against DNS rebinding. A web page on
// attacker.example that rebinds its name to 127.0.0.1 makes the browser
// send its requests to the quick-start node (no auth) as same-origin
// requests to attacker.example, so CORS does not stop it; what gives it
// away is the Host header, which names attacker.example. A node answers
// only the names it knows as its own (docs/security.md, "DNS rebinding"):
//
//   - any IP literal, v4 or v6: a rebinding needs a DNS name;
//   - localhost and *.localhost (which resolve to loopback by RFC 6761);
//   - the host parts of --listen, --advertise and --raft-advertise;
//   - the DNS names of the node's own TLS certificate (the current one);
//   - the names of --allowed-hosts ("*" turns the check off).
//
// Names compare case-insensitively, without the port and a trailing dot.
// An Origin header, when present, must name an allowed host too (a page
// served from a rebound name that calls the node by IP literal sends its
// own origin). A request without a Host (HTTP/1.0) is not a browser's and
// passes.

// hostPolicy decides which Host and Origin headers a node answers.
type hostPolicy struct {
	any   bool            // "*" among the allowed hosts: no check
	names map[string]bool // normalized names
	wild  []string        // "*.example.com" as ".example.com"
	tls   *certs.Store    // nil: no certificate names

	// certNames caches the DNS names of the last certificate seen, read
	// again at most every certNamesEvery (reading the current certificate
	// stats its files).
	certMu    sync.Mutex
	certLeaf  []byte
	certNames []string
	certRead  time.Time

	refused *prometheus.CounterVec // by header: host, origin
	log     *sparseLog
	audit   func(peer, op, reason string)
}

// refusalLogEvery is how often at most a refusal of a Host or of a
// connection is logged (the first at once, the next ones counted into the
// following line): a flood of them must not flood the log.
const refusalLogEvery = 10 * time.Second

// newHostPolicy returns the policy of a node: hosts are the names it knows
// as its own beside --allowed-hosts (allowed).
func newHostPolicy(allowed, hosts []string, store *certs.Store) *hostPolicy {
	p := &hostPolicy{names: map[string]bool{}, tls: store}
	for _, raw := range append(append([]string(nil), allowed...), hosts...) {
		h := normalizeHost(raw)
		switch {
		case h == "" || h == "*.":
		case h == "*":
			p.any = raw == "*" // not "*." (Validate refuses it)
		case strings.HasPrefix(h, "*."):
			p.wild = append(p.wild, h[1:])
		default:
			p.names[h] = true
		}
	}
	return p
}

// normalizeHost returns the host of a Host header or host[:port], lower
// case, without the port, the brackets of an IPv6 literal and a trailing
// dot.
func normalizeHost(h string) string {
	h = strings.TrimSpace(h)
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			h = h[1:i]
		}
	} else if strings.Count(h, ":") == 1 {
		h = h[:strings.IndexByte(h, ':')]
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// ValidAllowedHost reports whether h is a valid --allowed-hosts entry: a
// host name (no scheme or path), *.domain, or * alone. Checked after
// normalizing too: "*." (a template's "*.${DOMAIN}" with DOMAIN unset)
// normalizes to "*", which would turn the check off without a word.
func ValidAllowedHost(h string) bool {
	n := normalizeHost(h)
	return !(h == "" || strings.ContainsAny(h, "/ \t") || strings.Contains(h[1:], "*") ||
		n == "" || n == "*" && h != "*" || n == "*.")
}

// allowed reports whether a Host header (or an Origin's host) names this
// node.
func (p *hostPolicy) allowed(host string) bool {
	if p == nil || p.any {
		return true
	}
	h := normalizeHost(host)
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || p.names[h] {
		return true
	}
	for _, w := range p.wild {
		if underWild(h, w) {
			return true
		}
	}
	for _, n := range p.tlsNames() {
		if n == h || strings.HasPrefix(n, "*.") && underWild(h, n[1:]) {
			return true
		}
	}
	return false
}

// certNamesEvery is how often at most the Host check reads the node's
// current certificate for its names: a request naming the node by one of
// them should not cost a stat of every TLS file.
const certNamesEvery = time.Second

// underWild reports whether h is one label under suffix (".example.com"),
// as a wildcard name matches in a certificate.
func underWild(h, suffix string) bool {
	label, ok := strings.CutSuffix(h, suffix)
	return ok && label != "" && !strings.Contains(label, ".")
}

// tlsNames returns the DNS names of the node's current certificate: a
// certificate swapped on disk brings its names with it.
func (p *hostPolicy) tlsNames() []string {
	if p.tls == nil {
		return nil
	}
	p.certMu.Lock()
	if !p.certRead.IsZero() && time.Since(p.certRead) < certNamesEvery {
		defer p.certMu.Unlock()
		return p.certNames
	}
	p.certMu.Unlock()
	m := p.tls.Current()
	if m == nil || m.Cert == nil || len(m.Cert.Certificate) == 0 {
		return nil
	}
	der := m.Cert.Certificate[0]
	p.certMu.Lock()
	defer p.certMu.Unlock()
	p.certRead = time.Now()
	if string(der) != string(p.certLeaf) {
		p.certLeaf, p.certNames = der, nil
		leaf := m.Cert.Leaf
		if leaf == nil {
			leaf, _ = x509.ParseCertificate(der)
		}
		if leaf != nil {
			for _, n := range leaf.DNSNames {
				p.certNames = append(p.certNames, normalizeHost(n))
			}
		}
	}
	return p.certNames
}

// check returns why r is refused ("host" or "origin"), or "".
func (p *hostPolicy) check(r *http.Request) string {
	if p == nil || p.any {
		return ""
	}
	if r.Host != "" && !p.allowed(r.Host) {
		return "host"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !p.allowed(u.Host) {
			return "origin" // "null" (a sandboxed or file: page) included
		}
	}
	return ""
}

// handler refuses, before next sees them, requests whose Host or Origin
// header names no allowed host: 403 with a one-line answer naming the
// flag that allows it.
func (p *hostPolicy) handler(next http.Handler) http.Handler {
	if p == nil || p.any {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		which := p.check(r)
		if which == "" {
			next.ServeHTTP(w, r)
			return
		}
		name := r.Host
		if which == "origin" {
			name = r.Header.Get("Origin")
		}
		if len(name) > 200 {
			name = name[:200] + "…"
		}
		msg := fmt.Sprintf("lockd: %s %q is not a name of this node (DNS rebinding guard); to allow it, add its host to --allowed-hosts", map[string]string{"host": "Host", "origin": "Origin"}[which], name)
		p.refuse(r, which, msg)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintln(w, msg)
	})
}

// refuse counts a refusal and logs it, at most one line per refusalLogEvery
// (with the count of the ones not logged), and audits it (aggregated per
// client address like limit refusals).
func (p *hostPolicy) refuse(r *http.Request, which, msg string) {
	if p.refused != nil {
		p.refused.WithLabelValues(which).Inc()
	}
	if p.audit != nil {
		p.audit(r.RemoteAddr, "HostCheck", msg)
	}
	if p.log == nil {
		return
	}
	p.log.warn("request refused: Host or Origin names no allowed host (add it with --allowed-hosts)",
		"peer", r.RemoteAddr, "host", r.Host, "origin", r.Header.Get("Origin"), "path", r.URL.Path)
}

// openHostPolicy builds the node's Host/Origin policy: the hosts of
// --listen, --advertise (or the URL derived from the listener) and
// --raft-advertise are its own names.
func (g *Guard) openHostPolicy(c Config) {
	g.hosts = newHostPolicy(c.AllowedHosts, c.OwnHosts, g.d.TLS)
	g.hosts.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_host_refused_total", Help: "HTTP requests refused because their Host or Origin header names no allowed host (DNS rebinding guard), by header.",
	}, []string{"header"})
	for _, h := range []string{"host", "origin"} {
		g.hosts.refused.WithLabelValues(h)
	}
	g.d.Registerer.MustRegister(g.hosts.refused)
	g.hosts.log = &sparseLog{log: g.d.Log.With("component", "http")}
	g.hosts.audit = func(peer, op, reason string) { g.audit.netRefused(peer, op, "permission_denied", reason) }
}
