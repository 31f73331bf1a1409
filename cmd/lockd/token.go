package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/lockd-dev/lockd/internal/auth"
)

// TokenCommand is `lockd token`: make a bearer token for an identity (or
// hash a given one) and print the lines to add to the auth file. The
// token itself is written to --out (mode 0600), never printed, when --out
// is given; else it is printed once on stderr.
type TokenCommand struct {
	env commandEnv
}

const tokenUsage = "lockd token [--out FILE] [--grant PERM[:PREFIX]]... IDENTITY"

// Run makes the token.
func (c *TokenCommand) Run(_ context.Context, args []string) error {
	fs := newFlagSet("token", c.env.stderr)
	out := fs.String("out", "", "write the new token to this file (mode 0600) instead of stderr")
	hashOf := fs.String("hash-of", "", "hash this existing token file instead of making a new token")
	var grants []string
	fs.Func("grant", "add a grant line: read, lock, admin or peer, with :PREFIX for read and lock (repeatable)", func(v string) error {
		perm, prefix, _ := strings.Cut(v, ":")
		switch perm {
		case "read", "lock", "admin", "peer":
		default:
			return fmt.Errorf("unknown permission %q", perm)
		}
		grants = append(grants, strings.TrimSpace(perm+" "+prefix))
		return nil
	})
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(pos, 1, 1, tokenUsage); err != nil {
		return err
	}
	id := pos[0]
	if !auth.ValidIdentity(id) {
		return usageError{fmt.Errorf("identity %q: 1 to %d letters, digits or ._-@:/", id, auth.MaxIdentityBytes)}
	}
	var token string
	if *hashOf != "" {
		b, err := os.ReadFile(*hashOf)
		if err != nil {
			return err
		}
		token, _, _ = strings.Cut(string(b), "\n")
		token = strings.TrimSpace(token)
	} else {
		var b [32]byte
		_, _ = rand.Read(b[:])
		token = "lockd_" + hex.EncodeToString(b[:])
		if err := c.writeToken(*out, token); err != nil {
			return err
		}
	}
	w := c.env.stdout
	fmt.Fprintf(w, "token %s %s\n", auth.HashToken(token), id)
	for _, g := range grants {
		fmt.Fprintf(w, "grant %s %s\n", id, g)
	}
	return nil
}

func (c *TokenCommand) writeToken(path, token string) error {
	if path == "" {
		_, err := fmt.Fprintf(c.env.stderr, "new token (shown once; keep it secret): %s\n", token)
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, token+"\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
