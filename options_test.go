package lockd

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestNormalizeEndpoint(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1:7070", "http://127.0.0.1:7070"},
		{"localhost", "http://localhost:7070"},
		{"lockd-1:9000", "http://lockd-1:9000"},
		{" Lockd-1:9000 ", "http://lockd-1:9000"},
		{"[::1]:7070", "http://[::1]:7070"},
		{"[::1]", "http://[::1]:7070"},
		{"http://a:1/", "http://a:1"},
		{"https://lockd.example.com", "https://lockd.example.com"},
		{"https://lockd.example.com/api/", "https://lockd.example.com/api"},
		{"HTTP://A:1", "http://a:1"},
		{"a:1/prefix", "http://a:1/prefix"},
	}
	for _, tt := range tests {
		got, err := normalizeEndpoint(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("normalizeEndpoint(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "  ", "ftp://a:1", "http://", "http://:7070", "::1", "a:0", "a:99999", "a:x",
		"http://a:1?x=1", "http://a:1#f", "http://u:p@a:1"} {
		if got, err := normalizeEndpoint(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("normalizeEndpoint(%q) = %q, %v; want ErrInvalidArgument", bad, got, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	bad := map[string]Option{
		"no endpoints":     WithEndpoints(),
		"bad endpoint":     WithEndpoints("ok:1", "ftp://x"),
		"nil http":         WithHTTPClient(nil),
		"zero timeout":     WithRequestTimeout(0),
		"negative timeout": WithRequestTimeout(-time.Second),
		"negative retry":   WithRetryTimeout(-1),
		"nil logger":       WithLogger(nil),
	}
	for name, o := range bad {
		if c, err := New(o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: New = %v, %v; want ErrInvalidArgument", name, c, err)
		}
	}
	c, err := New(WithEndpoints("a:1", "http://a:1", "b:2"), WithRequestTimeout(time.Second), WithRetryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.eps.All()); got != 2 {
		t.Errorf("got %d endpoints, want 2 (duplicates removed)", got)
	}
	c, err = New()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.eps.All()[0].URL, DefaultEndpoint; got != want {
		t.Errorf("default endpoint %q, want %q", got, want)
	}
	if got, want := c.cfg.requestTimeout, 5*time.Second; got != want {
		t.Errorf("default request timeout %v, want %v", got, want)
	}
}

func TestSessionOptionsValidate(t *testing.T) {
	bad := map[string]SessionOption{
		"ttl too short":  WithTTL(249 * time.Millisecond),
		"ttl too long":   WithTTL(time.Hour + 1),
		"owner too long": WithOwner(string(make([]byte, 257))),
		"nil func":       WithDeadlineFunc(nil),
	}
	for name, o := range bad {
		var cfg sessionConfig
		if err := o(&cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	var cfg sessionConfig
	for _, o := range []SessionOption{WithTTL(250 * time.Millisecond), WithTTL(time.Hour), WithOwner("billing-1/42")} {
		if err := o(&cfg); err != nil {
			t.Errorf("got %v", err)
		}
	}
}

// TestWithOwnerRefusesControlCharacters: an owner the
// server would refuse (control characters, as in lock names: C0, DEL, C1;
// invalid UTF-8) is refused by the option, before any call, saying why.
func TestWithOwnerRefusesControlCharacters(t *testing.T) {
	for owner, why := range map[string]string{
		"a\x1b]0;pwned\x07": "control character U+001B",
		"a\u009b31m":        "control character U+009B",
		"del\x7f":           "control character U+007F",
		"line\nbreak":       "control character U+000A",
		"bad\xff":           "not valid UTF-8",
	} {
		var cfg sessionConfig
		err := WithOwner(owner)(&cfg)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), why) {
			t.Errorf("WithOwner(%q): %v, want ErrInvalidArgument saying %q", owner, err, why)
		}
	}
	var cfg sessionConfig
	if err := WithOwner("billing é 名前 ✓")(&cfg); err != nil || cfg.owner != "billing é 名前 ✓" {
		t.Errorf("a printable UTF-8 owner: %v", err)
	}
}
