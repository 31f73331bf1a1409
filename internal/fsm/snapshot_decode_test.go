package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
)

// checkRestoreWhole fails unless restoring data by unmarshalling the whole
// snapshot first (the way before locks were decoded one at a time) agrees
// with RestoreBytes: the same refusal or acceptance (errOne), and when
// accepted the same state as restored (in one).
func checkRestoreWhole(t *testing.T, data []byte, errOne error, one *fsm.FSM) {
	t.Helper()
	whole := fsm.New(nil)
	errWhole := whole.RestoreWhole(data)
	switch {
	case (errOne == nil) != (errWhole == nil):
		t.Fatalf("lock by lock: %v; whole: %v", errOne, errWhole)
	case errOne == nil && !proto.Equal(one.State(), whole.State()):
		t.Fatalf("lock by lock and whole restores differ:\n%v\n%v", one.State(), whole.State())
	}
}
