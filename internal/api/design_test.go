package api

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/designdoc"
)

// TestDesignTable: DESIGN.md's file table names every file of the
// package, and only those.
func TestDesignTable(t *testing.T) { designdoc.CheckFileTable(t, ".") }
