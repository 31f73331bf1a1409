//go:build lockdgatetest

package fsm

import (
	"strings"

	"google.golang.org/protobuf/proto"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// With the build tag lockdgatetest (the version gate's tests only), an
// Acquire of a lock whose name begins with "v2/" needs version 2: a
// stand-in for a version-2 command, so the tests show the gate refuse and
// then accept it. Apply decides it exactly as any Acquire, so nodes built
// with and without the tag never diverge on it.
func init() {
	versionTable = append(versionTable, versionRow{CmdAcquire, 2, func(m proto.Message) bool {
		return strings.HasPrefix(m.(*fsmv1.Acquire).GetName(), "v2/")
	}})
}
