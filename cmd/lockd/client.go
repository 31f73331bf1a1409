package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// endpointsEnv names the environment variable with the default endpoints.
const endpointsEnv = "LOCKD_ENDPOINTS"

// tokenFileEnv names the default of --token-file.
const tokenFileEnv = "LOCKD_TOKEN_FILE"

// streamEnv names the environment variable that turns the client's session
// stream off (off, 0 or false): every call then goes unary over HTTP/1.1
// (lockd.WithStream(false)). The escape hatch when a proxy breaks streams in
// a way the client's fallback does not detect; the library itself reads no
// environment.
const streamEnv = "LOCKD_STREAM"

// streamOn reports whether the value of $LOCKD_STREAM leaves the session
// stream on: anything but off, 0 or false.
func streamOn(v string) bool {
	switch strings.TrimSpace(v) {
	case "off", "0", "false":
		return false
	}
	return true
}

// commandEnv is what the client subcommands share.
type commandEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// defaultConnectTimeout is --connect-timeout's default: how long a command
// keeps trying when no server answers at all.
const defaultConnectTimeout = 5 * time.Second

// clientFlags are the flags of every subcommand that talks to a server.
type clientFlags struct {
	endpoints      string
	timeout        time.Duration
	connectTimeout time.Duration
	ca, cert, key  string // TLS files (--ca, --cert, --key)
	tokenFile      string
	stream         bool // the session stream ($LOCKD_STREAM)
}

// Environment variables with the defaults of --ca, --cert and --key.
const (
	caEnv   = "LOCKD_CA"
	certEnv = "LOCKD_CERT"
	keyEnv  = "LOCKD_KEY"
)

func (f *clientFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	def := lockd.DefaultEndpoint
	if getenv != nil {
		if v := strings.TrimSpace(getenv(endpointsEnv)); v != "" {
			def = v
		}
	}
	fs.StringVar(&f.endpoints, "endpoints", def, "comma-separated server endpoints, host:port or URL (default $"+endpointsEnv+" or "+lockd.DefaultEndpoint+")")
	env := func(name string) string {
		if getenv == nil {
			return ""
		}
		return strings.TrimSpace(getenv(name))
	}
	f.stream = streamOn(env(streamEnv))
	fs.StringVar(&f.ca, "ca", env(caEnv), "CA certificate (PEM) that verifies the servers; turns on TLS, https for host:port endpoints (default $"+caEnv+")")
	fs.StringVar(&f.cert, "cert", env(certEnv), "client certificate (PEM) for servers that ask for one; needs --key; turns on TLS (default $"+certEnv+")")
	fs.StringVar(&f.key, "key", env(keyEnv), "--cert's private key (PEM) (default $"+keyEnv+")")
	fs.StringVar(&f.tokenFile, "token-file", env(tokenFileEnv), "file holding the bearer token for a server run with --auth-file (default $"+tokenFileEnv+")")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", defaultConnectTimeout, "give up (exit 69) when no server answered at all within this time, even if --wait or --timeout allow longer (0: no limit)")
}

// registerTimeout adds --timeout, for the commands that make one call.
func (f *clientFlags) registerTimeout(fs *flag.FlagSet) {
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "give up when no server answered within this time")
}

// withTimeout bounds ctx by --timeout, if set.
func (f *clientFlags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, f.timeout)
}

// parse parses the arguments of a one-call admin command `lockd name`: the
// client flags (--endpoints, --timeout), the command's own (added by
// flags), and between minN and maxN positional arguments.
func (e commandEnv) parse(name, usage string, args []string, minN, maxN int, flags func(*flag.FlagSet)) ([]string, *clientFlags, error) {
	fs := newFlagSet(name, e.stderr)
	cf := &clientFlags{}
	cf.register(fs, e.getenv)
	cf.registerTimeout(fs)
	if flags != nil {
		flags(fs)
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if err := wantArgs(pos, minN, maxN, usage); err != nil {
		return nil, nil, err
	}
	return pos, cf, nil
}

// connect returns a client and ctx bounded by --timeout; done releases both.
func (f *clientFlags) connect(ctx context.Context) (context.Context, *lockd.Client, func(), error) {
	cl, err := f.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := f.withTimeout(ctx)
	return ctx, cl, func() { cancel(); cl.Close(context.Background()) }, nil
}

func (f *clientFlags) client() (*lockd.Client, error) {
	var eps []string
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if f.connectTimeout < 0 {
		return nil, usageError{fmt.Errorf("--connect-timeout %v must not be negative", f.connectTimeout)}
	}
	opts := []lockd.Option{lockd.WithEndpoints(eps...), lockd.WithConnectTimeout(f.connectTimeout), lockd.WithStream(f.stream)}
	if f.tlsOn() {
		if (f.cert == "") != (f.key == "") {
			return nil, usageError{errors.New("--cert and --key go together")}
		}
		opts = append(opts, lockd.WithTLSFiles(f.ca, f.cert, f.key))
	}
	if f.tokenFile != "" {
		opts = append(opts, lockd.WithTokenFile(f.tokenFile))
	}
	c, err := lockd.New(opts...)
	if err != nil {
		flags := "--endpoints, --token-file"
		if f.tlsOn() {
			flags = "--endpoints, --token-file, --ca, --cert, --key"
		}
		return nil, usageError{fmt.Errorf("%s: %w", flags, err)}
	}
	return c, nil
}

// tlsConfig returns a tls.Config from --ca, --cert and --key, read once
// (lockd bench, which builds its own transports).
func (f *clientFlags) tlsConfig() (*tls.Config, error) {
	if (f.cert == "") != (f.key == "") {
		return nil, usageError{errors.New("--cert and --key go together")}
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		b, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, usageError{fmt.Errorf("--ca: %w", err)}
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, usageError{fmt.Errorf("--ca %s: no PEM certificate in it", f.ca)}
		}
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, usageError{fmt.Errorf("--cert, --key: %w", err)}
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// tlsOn reports whether a TLS flag was given.
func (f *clientFlags) tlsOn() bool { return f.ca != "" || f.cert != "" || f.key != "" }

// newFlagSet returns a flag set for `lockd name` that reports errors
// instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("lockd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseArgs parses flags and positional arguments in any order ("describe
// NAME --json" as well as "describe --json NAME"); "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// fs.Parse stopped at a positional argument or after "--".
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// wantArgs checks the number of positional arguments.
func wantArgs(pos []string, minN, maxN int, usage string) error {
	if len(pos) < minN || len(pos) > maxN {
		return usageError{fmt.Errorf("usage: %s", usage)}
	}
	return nil
}

// callError maps an error of a client call to the documented exit statuses.
func callError(what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	switch {
	case errors.Is(err, context.Canceled):
		return exitWith(exitFailure, fmt.Errorf("%s: interrupted", what))
	case errors.Is(err, lockd.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return exitWith(exitUnavailable, err)
	case errors.Is(err, lockd.ErrInvalidArgument):
		return exitWith(exitUsage, err)
	}
	return exitWith(exitFailure, err)
}

// printJSON writes m in the proto3 JSON mapping, the JSON the API speaks
// (64-bit tokens as decimal strings).
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	// protojson varies its whitespace on purpose; indent it the same way
	// every time for people and diffs.
	return writeIndented(w, b)
}

// writeIndented writes JSON b to w indented by two spaces, with a newline.
func writeIndented(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, escapeJSON(b), "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := out.WriteTo(w)
	return err
}

func consistency(stale bool) lockdv1.ReadConsistency {
	if stale {
		return lockdv1.ReadConsistency_READ_CONSISTENCY_STALE
	}
	return lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE
}

func modeName(m lockdv1.Mode) string {
	if m == lockdv1.Mode_MODE_SHARED {
		return "shared"
	}
	return "exclusive"
}
