package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/certs"
)

// CertCommand is `lockd cert`: make a development CA and the node and
// client certificates it signs (ECDSA P-256, PEM files). Production
// clusters use their own PKI; the files have the same shape.
type CertCommand struct {
	env commandEnv
}

const certUsage = `Usage:

	lockd cert ca [--dir DIR]                        DIR/ca.crt, DIR/ca.key
	lockd cert node NAME [--dir DIR] [--host H,...]  DIR/NAME.crt, DIR/NAME.key
	lockd cert client NAME [--dir DIR]               DIR/NAME.crt, DIR/NAME.key

A node certificate serves the API and Raft and authenticates the node to
its peers; its SANs are NAME, localhost, 127.0.0.1, ::1 and every --host
(the addresses clients and peers dial). It names both server and client
authentication as extended key usages: that makes it a cluster member's.
A client certificate names a client (its common name is NAME) and client
authentication only: it is never a member's, even from the cluster CA.
Existing files are never overwritten.

Flags:

`

// Run makes the files and prints their names.
func (c *CertCommand) Run(_ context.Context, args []string) error {
	fs := newFlagSet("cert", c.env.stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), certUsage)
		fs.PrintDefaults()
	}
	dir := fs.String("dir", ".", "directory of the files written, and of the CA's (ca.crt, ca.key)")
	caCert := fs.String("ca-cert", "", "CA certificate that signs (default DIR/ca.crt)")
	caKey := fs.String("ca-key", "", "CA key that signs (default DIR/ca.key)")
	hosts := fs.String("host", "", "comma-separated extra DNS names and IP addresses of a node")
	valid := fs.Duration("valid", 0, "validity (default 87600h for a CA, 8760h otherwise)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fs.Usage()
		return usageError{errors.New("usage: lockd cert ca|node|client [NAME]")}
	}
	kind, pos := pos[0], pos[1:]
	if *caCert == "" {
		*caCert = filepath.Join(*dir, "ca.crt")
	}
	if *caKey == "" {
		*caKey = filepath.Join(*dir, "ca.key")
	}
	var out certs.PEM
	var name string
	switch kind {
	case "ca":
		if err := wantArgs(pos, 0, 0, "lockd cert ca [--dir DIR]"); err != nil {
			return err
		}
		if out, err = certs.NewCA("lockd dev ca", orDefault(*valid, 10*365*24*time.Hour)); err != nil {
			return err
		}
		name = "ca"
	case "node", "client":
		if err := wantArgs(pos, 1, 1, "lockd cert "+kind+" NAME [--dir DIR]"); err != nil {
			return err
		}
		name = pos[0]
		if name == "ca" || strings.ContainsAny(name, `/\`) || name == "" {
			return usageError{fmt.Errorf("name %q: want a plain file name other than ca", name)}
		}
		ca, err := readCA(*caCert, *caKey)
		if err != nil {
			return err
		}
		k := certs.Client
		var sans []string
		if kind == "node" {
			k = certs.Node
			sans = append([]string{name, "localhost", "127.0.0.1", "::1"}, splitList(*hosts)...)
		}
		if out, err = certs.Issue(ca, k, name, sans, orDefault(*valid, 365*24*time.Hour)); err != nil {
			return err
		}
	default:
		return usageError{fmt.Errorf("lockd cert %q: want ca, node or client", kind)}
	}
	crt, key := filepath.Join(*dir, name+".crt"), filepath.Join(*dir, name+".key")
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if err := writeNew(crt, out.Cert, 0o644); err != nil {
		return err
	}
	if err := writeNew(key, out.Key, 0o600); err != nil {
		os.Remove(crt)
		return err
	}
	fmt.Fprintf(c.env.stdout, "wrote %s and %s\n", crt, key)
	return nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func readCA(certFile, keyFile string) (certs.PEM, error) {
	c, err := os.ReadFile(certFile)
	if err != nil {
		return certs.PEM{}, fmt.Errorf("read ca certificate (make one with lockd cert ca): %w", err)
	}
	k, err := os.ReadFile(keyFile)
	if err != nil {
		return certs.PEM{}, fmt.Errorf("read ca key: %w", err)
	}
	return certs.PEM{Cert: c, Key: k}, nil
}

// writeNew writes a file that must not exist yet.
func writeNew(name string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
