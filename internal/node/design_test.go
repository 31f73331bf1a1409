package node

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/designdoc"
)

// TestDesignTable: DESIGN.md's file table names every file of the
// package, and only those.
func TestDesignTable(t *testing.T) { designdoc.CheckFileTable(t, ".") }

// TestMethodCount: no type of the package has more than 30 methods.
func TestMethodCount(t *testing.T) { designdoc.CheckMethodCount(t, ".", 30) }

// TestNoAPIImports: the node never depends on its API or the assembly;
// they call into it.
func TestNoAPIImports(t *testing.T) {
	designdoc.CheckNoDeps(t, ".", "/internal/api", "/internal/server")
}
