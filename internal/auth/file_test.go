package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/auth"
)

const example = `# lockd auth file
token ` + "%BILLING%" + ` billing-app
grant billing-app lock billing/
token ` + "%READER%" + ` dashboard
grant dashboard read      # every name
token ` + "%ADMIN%" + ` ops
grant ops admin
token ` + "%PEER%" + ` node
grant node peer
limit * rate=100 burst=200
limit billing-app sessions=10 waits=5 streams=7
`

func exampleFile(t *testing.T) *auth.File {
	t.Helper()
	r := strings.NewReplacer("%BILLING%", auth.HashToken("b-token"), "%READER%", auth.HashToken("r-token"),
		"%ADMIN%", auth.HashToken("a-token"), "%PEER%", auth.HashToken("p-token"))
	a, err := auth.Parse([]byte(r.Replace(example)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestRules(t *testing.T) {
	a := exampleFile(t)
	for tok, want := range map[string]string{"b-token": "billing-app", "r-token": "dashboard", "a-token": "ops", "p-token": "node"} {
		if id, ok := a.Identify(tok); !ok || id != want {
			t.Errorf("Identify(%s) = %q %v, want %q", tok, id, ok, want)
		}
	}
	if _, ok := a.Identify("nope"); ok {
		t.Error("unknown token identified")
	}
	if _, ok := a.Identify(""); ok {
		t.Error("empty token identified")
	}
	cases := []struct {
		id   string
		perm auth.Perm
		name string
		want bool
	}{
		{"billing-app", auth.Lock, "billing/x", true},
		{"billing-app", auth.Read, "billing/x", true},
		{"billing-app", auth.Lock, "payments/x", false},
		{"billing-app", auth.Read, "payments/x", false},
		{"billing-app", auth.Read, "", false},
		{"billing-app", auth.Admin, "", false},
		{"dashboard", auth.Read, "payments/x", true},
		{"dashboard", auth.Lock, "payments/x", false},
		{"ops", auth.Lock, "anything", true},
		{"ops", auth.Admin, "", true},
		{"ops", auth.Peer, "", false},
		{"node", auth.Peer, "", true},
		{"node", auth.Lock, "x", false},
		{"stranger", auth.Read, "x", false},
	}
	for _, c := range cases {
		if got := a.Allows(c.id, c.perm, c.name); got != c.want {
			t.Errorf("Allows(%s, %v, %q) = %v, want %v", c.id, c.perm, c.name, got, c.want)
		}
	}
	def := auth.Limits{Rate: 1, Burst: 2, Sessions: 3, Waits: 4, Streams: 6}
	if l := a.LimitsOf("billing-app", def); l != (auth.Limits{Rate: 1, Burst: 2, Sessions: 10, Waits: 5, Streams: 7}) {
		t.Errorf("billing-app limits %+v", l)
	}
	if l := a.LimitsOf("ops", def); l != (auth.Limits{Rate: 100, Burst: 200, Sessions: 3, Waits: 4, Streams: 6}) {
		t.Errorf("ops limits %+v", l)
	}
}

func TestParseErrors(t *testing.T) {
	h := auth.HashToken("x")
	for _, bad := range []string{
		"token " + h,
		"token md5:abcd x",
		"token sha256:abcd x\ngrant x read",
		"token " + h + " bad id\ngrant x read",
		"token " + h + " a\ntoken " + h + " b\ngrant a read\ngrant b read",
		"token " + h + " lonely",
		"grant x write",
		"grant x",
		"limit x rate=-1",
		"limit x sessions=0",
		"limit x color=3",
		"limit x",
		"frobnicate",
		"grant x read " + strings.Repeat("p", 600),
		"\xff",
		strings.Repeat("#", 5000),
	} {
		if _, err := auth.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// FuzzParse: any input is either refused or parsed into a file whose every
// token names an identity with a grant and whose identities are valid.
func FuzzParse(f *testing.F) {
	f.Add([]byte(strings.NewReplacer("%BILLING%", auth.HashToken("b"), "%READER%", auth.HashToken("r"),
		"%ADMIN%", auth.HashToken("a"), "%PEER%", auth.HashToken("p")).Replace(example)))
	f.Add([]byte("grant x read *\nlimit * rate=0.5"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := auth.Parse(b)
		if err != nil {
			return
		}
		for _, id := range a.Tokens {
			if !auth.ValidIdentity(id) || len(a.Grants[id]) == 0 {
				t.Fatalf("token for %q without a grant or with a bad identity", id)
			}
		}
		for id, gs := range a.Grants {
			for _, g := range gs {
				if !auth.ValidIdentity(id) || g.Perm < auth.Read || g.Perm > auth.Peer {
					t.Fatalf("bad grant %q %+v", id, g)
				}
			}
		}
	})
}

// TestMaxHoldLimit: max_hold= is a duration from 1ms to 720h, per identity
// or for "*", and absent means the server default (none).
func TestMaxHoldLimit(t *testing.T) {
	a, err := auth.Parse([]byte("limit * max_hold=10m\nlimit batch max_hold=2h rate=5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.LimitsOf("batch", auth.Limits{}).MaxHold; got != 2*time.Hour {
		t.Errorf("batch: %v", got)
	}
	if got := a.LimitsOf("other", auth.Limits{}).MaxHold; got != 10*time.Minute {
		t.Errorf("other: %v", got)
	}
	b, err := auth.Parse([]byte("limit x rate=5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.LimitsOf("x", auth.Limits{}).MaxHold; got != 0 {
		t.Errorf("no max_hold line: %v", got)
	}
	for _, bad := range []string{"max_hold=0s", "max_hold=-1m", "max_hold=721h", "max_hold=soon", "max_hold=500us"} {
		if _, err := auth.Parse([]byte("limit x " + bad + "\n")); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
