package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"github.com/lockd-dev/lockd/internal/designdoc"
)

// TestDesignTable: DESIGN.md's file table names every file of the
// package, and only those.
func TestDesignTable(t *testing.T) { designdoc.CheckFileTable(t, ".") }

// TestMethodCount: no type of the package has more than 30 methods.
func TestMethodCount(t *testing.T) { designdoc.CheckMethodCount(t, ".", 30) }

// TestNoServerImports: the API never depends on the assembly
// (internal/server), which builds it.
func TestNoServerImports(t *testing.T) { designdoc.CheckNoDeps(t, ".", "/internal/server") }

// TestNoRaftHandle: no file of the API holds hashicorp/raft's *raft.Raft;
// what it needs of Raft goes through Cluster.
func TestNoRaftHandle(t *testing.T) {
	files, err := designdoc.SourceFiles(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Raft" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "raft" {
					t.Errorf("%s: raft.Raft", fset.Position(sel.Pos()))
				}
			}
			return true
		})
	}
}
