package guard

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/designdoc"
)

// TestDesignTable: DESIGN.md's file table names every file of the
// package, and only those.
func TestDesignTable(t *testing.T) { designdoc.CheckFileTable(t, ".") }

// TestNoNodeImports: the guard depends on no package of the node or its
// API, directly or not: what it needs is injected (Deps).
func TestNoNodeImports(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	for _, d := range deps {
		for _, banned := range []string{"/internal/server", "/internal/api", "/internal/node"} {
			if strings.HasSuffix(d, banned) || strings.Contains(d, banned+"/") {
				t.Errorf("internal/guard depends on %s", d)
			}
		}
	}
}

// TestMethodCounts: no type of the package has more than 30 methods.
func TestMethodCounts(t *testing.T) {
	files, err := designdoc.SourceFiles(".")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil {
				continue
			}
			typ := fd.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				counts[id.Name]++
			}
		}
	}
	if counts["Guard"] == 0 {
		t.Fatalf("no methods of Guard found: %v", counts)
	}
	for typ, n := range counts {
		if n > 30 {
			t.Errorf("%s has %d methods, more than 30", typ, n)
		}
		t.Logf("%s: %d methods", typ, n)
	}
}
