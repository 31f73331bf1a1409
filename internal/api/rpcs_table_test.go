package api

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/rpcs"
)

// TestEveryFrameHasAHandler: a method the table says a stream carries must
// be served on the stream.
func TestEveryFrameHasAHandler(t *testing.T) {
	for _, m := range rpcs.Frames() {
		if frameHandlers[m] == nil {
			t.Errorf("frame %s (%s): no handler in frameHandlers", m.Frame, m.Name)
		}
	}
	if len(frameHandlers) != len(rpcs.Frames()) {
		t.Errorf("%d frame handlers for %d frame kinds", len(frameHandlers), len(rpcs.Frames()))
	}
}
