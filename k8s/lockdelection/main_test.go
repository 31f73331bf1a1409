package lockdelection_test

import (
	"flag"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"
)

// TestMain keeps client-go's elector logs (klog) out of the test output
// unless -v is given.
func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Verbose() {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}
