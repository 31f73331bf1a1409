// Package auth is lockd's access control: the auth file (bearer tokens,
// stored as SHA-256 hashes, each naming an identity; per-prefix grants;
// per-identity limits), and the decision whether an identity may do an
// operation on a lock name. The server asks it in one place
// (internal/guard/authz.go). See docs/security.md.
package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Perm is what a grant allows.
type Perm int

// Permissions. Lock implies Read on the same prefix; Admin implies both on
// every name. Peer marks another lockd node: it may forward calls with
// the caller's identity, and join.
const (
	Read Perm = iota + 1
	Lock
	Admin
	Peer
)

var permNames = map[string]Perm{"read": Read, "lock": Lock, "admin": Admin, "peer": Peer}

// String returns the permission's name in the auth file.
func (p Perm) String() string {
	for n, v := range permNames {
		if v == p {
			return n
		}
	}
	return "perm(" + strconv.Itoa(int(p)) + ")"
}

// Grant allows an identity a permission on the lock names under a prefix
// ("" = every name).
type Grant struct {
	// Perm is what is allowed.
	Perm Perm
	// Prefix is the lock-name prefix it applies to.
	Prefix string
}

// Limits are per-identity limits; a zero field means the server default.
type Limits struct {
	// Rate is the sustained requests per second (token bucket).
	Rate float64
	// Burst is the bucket's size.
	Burst int
	// Sessions caps the live sessions the identity created.
	Sessions int
	// Waits caps the identity's queued Acquire calls in flight.
	Waits int
	// Streams caps the identity's open streams (session streams and
	// watches) on one node.
	Streams int
	// MaxHold is the ceiling of the identity's hold budgets: a hold of
	// the identity lasts at most this long, whatever its acquire or the
	// lock's policy asks (0: none).
	MaxHold time.Duration
}

// File is a parsed auth file.
type File struct {
	// Tokens maps a token's SHA-256 to its identity.
	Tokens map[[sha256.Size]byte]string
	// Grants lists each identity's grants in file order.
	Grants map[string][]Grant
	// Limits holds per-identity limits; the key "*" applies to every
	// identity without its own line.
	Limits map[string]Limits
}

// Bounds on an auth file, so a mistake cannot make the server hold an
// unbounded table.
const (
	maxFileBytes     = 4 << 20
	maxLineBytes     = 4096
	MaxIdentityBytes = 128
	maxPrefixBytes   = 512
	// maxHoldCeiling is the largest max_hold limit: the FSM's bound on a
	// hold budget (30 days).
	maxHoldCeiling = 720 * time.Hour
)

// ReadFile parses the auth file at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	a, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return a, nil
}

// Parse parses an auth file: one directive a line, '#' starts a comment.
//
//	token sha256:<64 hex digits> <identity>
//	grant <identity> read|lock|admin|peer [prefix]
//	limit <identity>|* [rate=N] [burst=N] [sessions=N] [waits=N] [streams=N]
//
// A grant's prefix is matched byte by byte ("billing/" covers
// "billing/x"); no prefix or "*" means every lock name.
func Parse(b []byte) (*File, error) {
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("file is larger than %d bytes", maxFileBytes)
	}
	if !utf8.Valid(b) {
		return nil, errors.New("file is not valid UTF-8")
	}
	a := &File{Tokens: map[[sha256.Size]byte]string{}, Grants: map[string][]Grant{}, Limits: map[string]Limits{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 1024), maxLineBytes)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if err := a.directive(f); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line longer than %d bytes: %w", maxLineBytes, err)
	}
	for _, id := range a.Tokens {
		if len(a.Grants[id]) == 0 {
			return nil, fmt.Errorf("identity %q has a token but no grant", id)
		}
	}
	return a, nil
}

func (a *File) directive(f []string) error {
	switch f[0] {
	case "token":
		if len(f) != 3 {
			return errors.New("want: token sha256:HEX IDENTITY")
		}
		hexHash, ok := strings.CutPrefix(f[1], "sha256:")
		if !ok {
			return errors.New(`token hash must start with "sha256:"`)
		}
		var h [sha256.Size]byte
		// Length first: hex.Decode writes past a too-short destination.
		if len(hexHash) != 2*sha256.Size {
			return errors.New("token hash must be 64 hex digits")
		}
		if _, err := hex.Decode(h[:], []byte(hexHash)); err != nil {
			return errors.New("token hash must be 64 hex digits")
		}
		if err := checkIdentity(f[2]); err != nil {
			return err
		}
		if old, dup := a.Tokens[h]; dup {
			return fmt.Errorf("token hash listed twice (identities %q and %q)", old, f[2])
		}
		a.Tokens[h] = f[2]
	case "grant":
		if len(f) < 3 || len(f) > 4 {
			return errors.New("want: grant <identity> read|lock|admin|peer [prefix]")
		}
		if err := checkIdentity(f[1]); err != nil {
			return err
		}
		p, ok := permNames[f[2]]
		if !ok {
			return fmt.Errorf("unknown permission %q (read, lock, admin or peer)", f[2])
		}
		g := Grant{Perm: p}
		if len(f) == 4 && f[3] != "*" {
			if len(f[3]) > maxPrefixBytes {
				return fmt.Errorf("prefix longer than %d bytes", maxPrefixBytes)
			}
			g.Prefix = f[3]
		}
		a.Grants[f[1]] = append(a.Grants[f[1]], g)
	case "limit":
		if len(f) < 3 {
			return errors.New("want: limit IDENTITY|* KEY=VALUE [KEY=VALUE]")
		}
		if f[1] != "*" {
			if err := checkIdentity(f[1]); err != nil {
				return err
			}
		}
		l := a.Limits[f[1]]
		for _, kv := range f[2:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("limit %q is not key=value", kv)
			}
			if k == "max_hold" {
				d, err := time.ParseDuration(v)
				if err != nil || d < time.Millisecond || d > maxHoldCeiling {
					return fmt.Errorf("max_hold %q is not a duration in [1ms, 720h]", v)
				}
				l.MaxHold = d
				continue
			}
			if k == "rate" {
				r, err := strconv.ParseFloat(v, 64)
				if err != nil || r <= 0 || r > 1e9 {
					return fmt.Errorf("rate %q is not a number in (0, 1e9]", v)
				}
				l.Rate = r
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 1<<30 {
				return fmt.Errorf("%s %q is not an integer in [1, 2^30]", k, v)
			}
			switch k {
			case "burst":
				l.Burst = n
			case "sessions":
				l.Sessions = n
			case "waits":
				l.Waits = n
			case "streams":
				l.Streams = n
			default:
				return fmt.Errorf("unknown limit %q (rate, burst, sessions, waits, streams or max_hold)", k)
			}
		}
		a.Limits[f[1]] = l
	default:
		return fmt.Errorf("unknown directive %q (token, grant or limit)", f[0])
	}
	return nil
}

// checkIdentity reports why id cannot be an identity: 1 to 128 bytes of
// letters, digits and . _ - @ : / only, so it is safe in logs and headers.
func checkIdentity(id string) error {
	if id == "" || len(id) > MaxIdentityBytes {
		return fmt.Errorf("identity must be 1 to %d bytes", MaxIdentityBytes)
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-@:/", r)
		if !ok {
			return fmt.Errorf("identity %q has character %q (letters, digits and ._-@:/ only)", id, r)
		}
	}
	return nil
}

// ValidIdentity reports whether id is a well-formed identity (as the
// leader checks a forwarded one).
func ValidIdentity(id string) bool { return checkIdentity(id) == nil }

// HashToken returns a token's auth-file line value, "sha256:<hex>".
func HashToken(token string) string {
	h := TokenKey(token)
	return "sha256:" + hex.EncodeToString(h[:])
}

// TokenKey is a token's key in File.Tokens (its SHA-256).
func TokenKey(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// Identify returns the identity of a bearer token, or false.
func (a *File) Identify(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	id, ok := a.Tokens[TokenKey(token)]
	return id, ok
}

// Allows reports whether identity may do perm on lock name. For Admin and
// Peer, name is ignored (they are cluster-wide). For a perm on a prefix
// rather than a name (ListLocks), pass the prefix: a grant covers it when
// the grant's prefix is a prefix of it.
func (a *File) Allows(identity string, perm Perm, name string) bool {
	for _, g := range a.Grants[identity] {
		switch {
		case g.Perm == Admin && perm != Peer:
			return true
		case g.Perm == perm && (perm == Admin || perm == Peer):
			return true
		case (g.Perm == perm || g.Perm == Lock && perm == Read) && strings.HasPrefix(name, g.Prefix):
			return true
		}
	}
	return false
}

// AnyLock reports whether identity may lock some name (to create a
// session).
func (a *File) AnyLock(identity string) bool {
	for _, g := range a.Grants[identity] {
		if g.Perm == Lock || g.Perm == Admin {
			return true
		}
	}
	return false
}

// LimitsOf returns identity's limits: its own line, else the "*" line,
// with zero fields filled from def.
func (a *File) LimitsOf(identity string, def Limits) Limits {
	l, ok := a.Limits[identity]
	if !ok {
		l = a.Limits["*"]
	}
	if l.Rate == 0 {
		l.Rate = def.Rate
	}
	if l.Burst == 0 {
		l.Burst = def.Burst
	}
	if l.Sessions == 0 {
		l.Sessions = def.Sessions
	}
	if l.Waits == 0 {
		l.Waits = def.Waits
	}
	if l.Streams == 0 {
		l.Streams = def.Streams
	}
	if l.MaxHold == 0 {
		l.MaxHold = def.MaxHold
	}
	return l
}
