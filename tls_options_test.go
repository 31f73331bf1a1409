package lockd

import (
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/certs"
)

// TestTLSOptions: the TLS options validate their values and exclude each
// other and WithHTTPClient; with TLS, endpoints written without a scheme
// and the default endpoint are https, explicit URLs stay as given.
func TestTLSOptions(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]Option{
		"nil config":          {WithTLSConfig(nil)},
		"missing ca file":     {WithTLSFiles(filepath.Join(dir, "none.crt"), "", "")},
		"cert without key":    {WithTLSFiles(caFile, caFile, "")},
		"config and files":    {WithTLSConfig(&tls.Config{}), WithTLSFiles(caFile, "", "")},
		"files and config":    {WithTLSFiles(caFile, "", ""), WithTLSConfig(&tls.Config{})},
		"tls and http client": {WithTLSFiles(caFile, "", ""), WithHTTPClient(&http.Client{})},
	} {
		if _, err := New(opts...); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	for _, tc := range []struct {
		opts []Option
		want []string
	}{
		{[]Option{WithTLSFiles(caFile, "", "")}, []string{"https://127.0.0.1:7070"}},
		{[]Option{WithEndpoints("a:1", "http://b:2", "https://c:3"), WithTLSConfig(&tls.Config{})}, []string{"https://a:1", "http://b:2", "https://c:3"}},
		{[]Option{WithTLSConfig(&tls.Config{}), WithEndpoints("a:1", "https://a:1")}, []string{"https://a:1"}},
		{[]Option{WithEndpoints("a:1")}, []string{"http://a:1"}},
	} {
		c, err := New(tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.cfg.endpoints; !slices.Equal(got, tc.want) {
			t.Errorf("endpoints %v, want %v", got, tc.want)
		}
	}
}
