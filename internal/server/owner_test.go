package server

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// TestCreateSessionRefusesControlCharactersInOwner: an
// owner label is printed in admins' terminals, so CreateSession refuses
// one with control characters (C0, DEL, C1: the lock names' rule) with
// InvalidArgument, before proposing anything; a printable UTF-8 owner is
// accepted.
func TestCreateSessionRefusesControlCharactersInOwner(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	c := lockdv1connect.NewLockServiceClient(http.DefaultClient, s.URL())
	ctx := t.Context()
	before := s.fsm.Info().Sessions
	for owner, why := range map[string]string{
		"a\x1b]0;pwned\x07":              "control character U+001B",
		"\x1b]8;;http://x/\x1b\\link":    "control character U+001B",
		"csi\u009b2J":                    "control character U+009B",
		"del\x7f":                        "control character U+007F",
		"tab\there":                      "control character U+0009",
		"next-line\u0085after":           "control character U+0085",
		"bell-only\a":                    "control character U+0007",
		"nul\x00":                        "control character U+0000",
		"carriage\rreturn":               "control character U+000D",
		"a\x1b[31mred\x1b[0m-looking-ok": "control character U+001B",
	} {
		_, err := c.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Owner: owner}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "owner contains "+why) {
			t.Errorf("owner %q: %v, want InvalidArgument saying the owner contains %s", owner, err, why)
		}
	}
	if n := s.fsm.Info().Sessions; n != before {
		t.Fatalf("%d sessions after the refusals, %d before", n, before)
	}
	if _, err := c.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Owner: "billing é 名前 ✓ holder@a/42"})); err != nil {
		t.Fatalf("a printable UTF-8 owner: %v", err)
	}
}
