package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestTokenCommand: `lockd token` writes a new token (0600) and prints the
// auth-file lines that let it in; every client command then takes it from
// --token-file or LOCKD_TOKEN_FILE, and without it is refused.
func TestTokenCommand(t *testing.T) {
	dir := t.TempDir()
	tokFile, adminFile := filepath.Join(dir, "billing.token"), filepath.Join(dir, "ops.token")
	var lines string
	for _, args := range [][]string{
		{"token", "--out", tokFile, "--grant", "lock:billing/", "billing-app"},
		{"token", "--out", adminFile, "--grant", "admin", "ops"},
	} {
		stdout, stderr, err := runMain(t, "", args...)
		if err != nil || stderr != "" {
			t.Fatalf("lockd %s: %v %s", strings.Join(args, " "), err, stderr)
		}
		lines += stdout
	}
	if !strings.Contains(lines, "grant billing-app lock billing/\n") || !strings.Contains(lines, "token sha256:") {
		t.Fatalf("auth lines:\n%s", lines)
	}
	if fi, err := os.Stat(tokFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	tok, _ := os.ReadFile(tokFile)
	if strings.Contains(lines, strings.TrimSpace(string(tok))) {
		t.Fatal("the token itself was printed")
	}
	// --hash-of prints the same line for an existing token.
	again, _, err := runMain(t, "", "token", "--hash-of", tokFile, "billing-app")
	if err != nil || !strings.Contains(lines, again) {
		t.Fatalf("--hash-of: %q %v", again, err)
	}
	authFile := filepath.Join(dir, "auth")
	if err := os.WriteFile(authFile, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := lockdtest.New(t, lockdtest.WithAuthFile(authFile))

	withEnv := func(token string, args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
			switch k {
			case endpointsEnv:
				return srv.URL()
			case tokenFileEnv:
				return token
			}
			return ""
		}}
		err := m.Run(context.Background(), args)
		return stdout.String() + stderr.String(), err
	}
	if out, err := withEnv(tokFile, "ls", "billing/"); err != nil {
		t.Errorf("ls billing/ with LOCKD_TOKEN_FILE: %v %s", err, out)
	}
	if out, err := withEnv("", "ls", "billing/", "--token-file", tokFile); err != nil {
		t.Errorf("ls billing/ with --token-file: %v %s", err, out)
	}
	if _, err := withEnv("", "ls", "billing/"); !errors.Is(err, lockd.ErrUnauthenticated) {
		t.Errorf("ls without a token: %v, want ErrUnauthenticated", err)
	}
	if _, err := withEnv(tokFile, "ls"); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Errorf("ls of every lock with billing's token: %v, want ErrPermissionDenied", err)
	}
	if _, err := withEnv(tokFile, "release", "--force", "billing/x"); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Errorf("release --force with billing token: %v", err)
	}
	if out, err := withEnv(adminFile, "snapshot", "save", filepath.Join(dir, "backup")); err != nil {
		t.Errorf("snapshot save as admin: %v %s", err, out)
	}
	// lockd run takes the same flag and variable.
	f, err := (&RunCommand{Stderr: &bytes.Buffer{}, Getenv: func(k string) string {
		if k == tokenFileEnv {
			return tokFile
		}
		return ""
	}}).parse([]string{"billing/job", "--", "true"})
	if err != nil || f.client.tokenFile != tokFile {
		t.Errorf("lockd run: token file %q, %v", f.client.tokenFile, err)
	}
}
