// Package endpoint turns the ways people write a lockd server's address
// into the one base URL the client and the server compare and dial.
package endpoint

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// DefaultPort is added to an endpoint given as a bare host name.
const DefaultPort = "7070"

// ClusterIDHeader is the response header in which every lockd server
// names its cluster's id, on every answer (errors and the snapshot
// download included), so that a client can refuse an endpoint of another
// cluster.
const ClusterIDHeader = "Lockd-Cluster-Id"

// ErrInvalid marks an endpoint that cannot be used.
var ErrInvalid = errors.New("invalid endpoint")

// Normalize turns "host:port", "host" (port 7070) or an http:// or https://
// URL into a base URL without a trailing slash, scheme and host in lower
// case, so that two spellings of one server compare equal. The error
// matches ErrInvalid.
func Normalize(s string) (string, error) { return NormalizeScheme(s, "http") }

// NormalizeScheme is Normalize with scheme ("http" or "https") for an
// endpoint written without one: a client or node configured for TLS
// reaches "host:port" over https.
func NormalizeScheme(s, scheme string) (string, error) {
	raw := strings.TrimSpace(s)
	if raw == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalid)
	}
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s", ErrInvalid, s, why)
	}
	if !strings.Contains(raw, "://") {
		host := raw
		if i := strings.IndexByte(host, '/'); i >= 0 {
			host = host[:i]
		}
		if _, _, err := net.SplitHostPort(host); err != nil {
			if strings.Count(host, ":") > 1 && !strings.HasPrefix(host, "[") {
				return "", bad("an IPv6 address needs brackets, as in [::1]:7070")
			}
			raw = net.JoinHostPort(strings.Trim(host, "[]"), DefaultPort) + raw[len(host):]
		}
		raw = scheme + "://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", bad(err.Error())
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", bad("scheme must be http or https")
	case u.Host == "" || u.Hostname() == "":
		return "", bad("no host")
	case u.RawQuery != "" || u.Fragment != "":
		return "", bad("no query or fragment allowed")
	case u.User != nil:
		return "", bad("no user info allowed")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return "", bad("bad port")
		}
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	return u.String(), nil
}
