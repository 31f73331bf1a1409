//go:build !lockdfault

package node

import "github.com/hashicorp/raft"

// WrapDisk returns the stores unchanged: a build without the tag
// lockdfault has no disk-fault hook and does not link internal/diskfault.
func WrapDisk(ls raft.LogStore, ss raft.StableStore) (raft.LogStore, raft.StableStore) {
	return ls, ss
}
