package lockd_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/lockd-dev/lockd/lockdtest"
)

// endpoint is the URL of the lockd server the examples talk to, started by
// TestMain; in your code it is where `lockd serve` listens
// (lockd.DefaultEndpoint by default).
var endpoint string

func TestMain(m *testing.M) {
	tb := &mainTB{}
	srv := lockdtest.New(tb)
	endpoint = srv.URL()
	code := m.Run()
	tb.cleanup()
	if tb.failed {
		code = 1
	}
	os.Exit(code)
}

// mainTB lets TestMain start a lockdtest server for the examples, which
// have no *testing.T of their own.
type mainTB struct {
	testing.TB
	cleanups []func()
	failed   bool
}

func (t *mainTB) Helper() {}

func (t *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "lockd-example-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *mainTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *mainTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func (t *mainTB) Errorf(format string, args ...any) {
	t.failed = true
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (t *mainTB) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	t.cleanup()
	os.Exit(1)
}
