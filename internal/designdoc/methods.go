package designdoc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// MethodCounts returns, per named type of the package in dir, how many
// methods its non-test files declare on it (value and pointer receivers
// together).
func MethodCounts(dir string) (map[string]int, error) {
	files, err := SourceFiles(dir)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", name, err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			if t := recvType(fd.Recv.List[0].Type); t != "" {
				counts[t]++
			}
		}
	}
	return counts, nil
}

// recvType is the type name of a receiver: T, *T, T[K] or *T[K].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// CheckMethodCount fails t for every type of the package in dir with more
// than limit methods: a type that keeps growing is doing more than one job.
func CheckMethodCount(t testing.TB, dir string, limit int) {
	t.Helper()
	counts, err := MethodCounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	var over []string
	for typ, n := range counts {
		if n > limit {
			over = append(over, fmt.Sprintf("%s has %d methods, more than %d", typ, n, limit))
		}
	}
	slices.Sort(over)
	if len(over) > 0 {
		t.Error(strings.Join(over, "; "))
	}
}
