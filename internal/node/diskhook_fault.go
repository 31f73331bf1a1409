//go:build lockdfault

package node

import (
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/diskfault"
)

// WrapDisk wraps the Raft log and stable stores in the test-only slow or
// hung disk of diskfault.EnvDelayFile, when the variable is set. Only a
// build with the tag lockdfault (the chaos tool's) has this hook.
func WrapDisk(ls raft.LogStore, ss raft.StableStore) (raft.LogStore, raft.StableStore) {
	disk := diskfault.FromEnv()
	return disk.LogStore(ls), disk.StableStore(ss)
}
