package lockdtest

import (
	"os"
	"strings"
)

// StreamEnv names the environment variable that Stream reads.
const StreamEnv = "LOCKD_STREAM"

// Stream reports whether a test's clients should use the session stream:
// true unless $LOCKD_STREAM is off, 0 or false. The client library reads no
// environment, so tests pass it on, lockd.WithStream(lockdtest.Stream()),
// which lets a second run of a suite with LOCKD_STREAM=off prove that the
// unary fallback keeps every guarantee.
func Stream() bool {
	switch strings.TrimSpace(os.Getenv(StreamEnv)) {
	case "off", "0", "false":
		return false
	}
	return true
}
