//go:build !linux

package supervise

// setSubreaper is a no-op where there are no child subreapers: orphaned
// grandchildren that left the group are then not found or reaped.
func setSubreaper() error { return nil }

func descendants(root int) []int { return nil }
