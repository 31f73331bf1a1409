// Package certs loads the TLS certificates of lockd nodes and clients from
// PEM files, reloads them when the files change, builds the tls.Configs of
// the API, Raft and client connections from them, and makes a development
// PKI (`lockd cert`).
//
// Reloading is checked on every handshake: the files are stat'ed (cheap next
// to a handshake) and read again when one changed (modification time, size
// or inode), so a certificate swapped on disk is used by the next new
// connection without a restart and without a polling goroutine. Reload forces
// a read (SIGHUP). A set of files that does not load (a key written before
// its certificate, say) is logged and the last good material stays in use.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
)

// Files names the PEM files of one node or client. Empty names are absent
// files.
type Files struct {
	// CA holds the certificates of the cluster's CA: a node verifies its
	// peers (and, without ClientCA, its clients) against it, and a client
	// verifies servers against it. Empty on a client: the system roots.
	CA string
	// Cert is this node's or client's certificate (with intermediates).
	Cert string
	// Key is Cert's private key.
	Key string
	// ClientCA holds the CAs a node verifies client certificates against,
	// when they are not the cluster's CA. Default: CA.
	ClientCA string
	// Check, when set, vets material newly read before it is used (a node
	// checks that its own certificate is a member's: CheckOwnMember).
	// Material that fails it is refused as files that do not load are:
	// Load fails, and a reload keeps the previous material.
	Check func(*Material) error
}

// Material is one loaded set of files.
type Material struct {
	// Cert is the certificate presented to the other side; nil when no
	// certificate file is configured (a client without a certificate).
	Cert *tls.Certificate
	// Roots are the cluster CA's certificates; nil means the system roots.
	Roots *x509.CertPool
	// ClientRoots are the CAs of client certificates (Roots by default).
	ClientRoots *x509.CertPool
	// anyRoots is Roots and ClientRoots together: what a node's API
	// handshake accepts, peers and clients alike.
	anyRoots *x509.CertPool
}

// Store holds the current Material of a set of files. It is safe for
// concurrent use.
type Store struct {
	files Files
	log   *slog.Logger

	mu     sync.Mutex // one reload at a time
	stamps []os.FileInfo
	cur    atomic.Pointer[Material]
}

// Load reads files and returns a Store that serves them. A certificate
// without a key (or a key without a certificate) is an error. log receives
// the reload events; nil discards them.
func Load(files Files, log *slog.Logger) (*Store, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("a certificate needs its key and a key its certificate")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{files: files, log: log}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the files now, whether or not they changed. On an error the
// previous material stays in use.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stamps = s.stat()
	m, err := s.files.load()
	if err != nil {
		return err
	}
	s.cur.Store(m)
	return nil
}

// Current returns the material to use for a new connection, reading the
// files again first when one of them changed since they were last read.
func (s *Store) Current() *Material {
	s.mu.Lock()
	defer s.mu.Unlock()
	stamps := s.stat()
	if changed(s.stamps, stamps) {
		s.stamps = stamps
		if m, err := s.files.load(); err != nil {
			s.log.Warn("tls files changed but do not load: keeping the previous certificates", "err", err)
		} else {
			s.cur.Store(m)
			s.log.Info("tls certificates reloaded", "cert", s.files.Cert, "not_after", notAfter(m))
		}
	}
	return s.cur.Load()
}

func notAfter(m *Material) string {
	if m.Cert == nil || m.Cert.Leaf == nil {
		return ""
	}
	return m.Cert.Leaf.NotAfter.UTC().Format("2006-01-02T15:04:05Z")
}

func (s *Store) stat() []os.FileInfo {
	var out []os.FileInfo
	for _, name := range []string{s.files.CA, s.files.Cert, s.files.Key, s.files.ClientCA} {
		var fi os.FileInfo
		if name != "" {
			fi, _ = os.Stat(name) // a missing file shows as a change, then a load error
		}
		out = append(out, fi)
	}
	return out
}

func changed(old, now []os.FileInfo) bool {
	if len(old) != len(now) {
		return true
	}
	for i := range old {
		a, b := old[i], now[i]
		switch {
		case a == nil && b == nil:
		case a == nil || b == nil:
			return true
		case !os.SameFile(a, b), !a.ModTime().Equal(b.ModTime()), a.Size() != b.Size():
			return true
		}
	}
	return false
}

func (f Files) load() (*Material, error) {
	m, err := f.read()
	if err != nil {
		return nil, err
	}
	if f.Check != nil {
		if err := f.Check(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// read reads the files.
func (f Files) read() (*Material, error) {
	m := &Material{}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("load certificate %s and key %s: %w", f.Cert, f.Key, err)
		}
		m.Cert = &pair
	}
	var err error
	if m.Roots, err = loadPool(f.CA); err != nil {
		return nil, err
	}
	m.ClientRoots = m.Roots
	if f.ClientCA != "" {
		if m.ClientRoots, err = loadPool(f.ClientCA); err != nil {
			return nil, err
		}
	}
	m.anyRoots = m.Roots
	if f.ClientCA != "" && f.CA != "" {
		m.anyRoots = x509.NewCertPool()
		for _, name := range []string{f.CA, f.ClientCA} {
			b, _ := os.ReadFile(name) // both just loaded
			m.anyRoots.AppendCertsFromPEM(b)
		}
	}
	return m, nil
}

func loadPool(name string) (*x509.CertPool, error) {
	if name == "" {
		return nil, nil
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read ca: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("ca %s: no PEM certificate in it", name)
	}
	return p, nil
}
