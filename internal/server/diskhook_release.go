//go:build !lockdfault

package server

import "github.com/hashicorp/raft"

// testDisk returns the stores unchanged: a build without the tag
// lockdfault has no disk-fault hook and does not link internal/diskfault.
func testDisk(ls raft.LogStore, ss raft.StableStore) (raft.LogStore, raft.StableStore) {
	return ls, ss
}
