package wallclock

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// wallMethods are the time.Time methods that read a time's wall-clock
// part (or strip its monotonic reading, as Round(0) and Truncate do).
var wallMethods = []string{
	"Unix", "UnixNano", "UnixMicro", "UnixMilli", "Format", "AppendFormat", "String",
	"Round", "Truncate", "UTC", "Local", "In", "Date", "Clock", "Year", "Month", "Day",
	"Hour", "Minute", "Second", "Nanosecond", "YearDay", "Weekday", "ISOWeek",
	"MarshalJSON", "MarshalText", "MarshalBinary", "GobEncode", "Zone",
}

// No server package reads the wall clock except through Now. The scan is
// syntactic, per function, in the non-test files of a node's packages
// (internal/server, internal/api, internal/node) and
// internal/fsm:
//   - internal/fsm calls no clock at all (time.Now, time.Since,
//     time.Until): Apply must be deterministic;
//   - in the node's packages, time.Now()'s result is used for durations and
//     deadlines only: no wall method (UnixNano, Format, Round(0), …) on
//     time.Now() itself, nor on a variable assigned from time.Now() in the
//     same function.
//
// What it cannot see: a time.Now() that travels through a struct field,
// a parameter or a return value before a wall method reads it. Review
// keeps those out; every one found when the package was added was moved
// to Now.
func TestNoWallClockReadsOutsideNow(t *testing.T) {
	fset := token.NewFileSet()
	var found []string
	for _, dir := range []string{"../server", "../api", "../node", "../fsm"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			found = append(found, scanFile(fset, f, filepath.Base(dir) == "fsm")...)
		}
	}
	for _, f := range found {
		t.Error(f)
	}
}

// isTimeCall reports whether e is a call time.<fn>(...) for fn in fns.
func isTimeCall(e ast.Expr, fns ...string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "time" && slices.Contains(fns, sel.Sel.Name)
}

// scanFile returns the forbidden wall-clock reads of one file.
func scanFile(fset *token.FileSet, f *ast.File, noClock bool) []string {
	var out []string
	report := func(n ast.Node, what string) {
		out = append(out, fset.Position(n.Pos()).String()+": "+what)
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		// Variables assigned from time.Now() in this function.
		nowVars := map[string]bool{}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if id, ok := n.Lhs[i].(*ast.Ident); ok && len(n.Lhs) == len(n.Rhs) && isTimeCall(rhs, "Now") {
						nowVars[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				for i, v := range n.Values {
					if i < len(n.Names) && isTimeCall(v, "Now") {
						nowVars[n.Names[i].Name] = true
					}
				}
			}
			return true
		})
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok && noClock && isTimeCall(e, "Now", "Since", "Until") {
				report(n, "the state machine reads a clock")
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !slices.Contains(wallMethods, sel.Sel.Name) {
				return true
			}
			if isTimeCall(sel.X, "Now") {
				report(n, "time.Now()."+sel.Sel.Name+": read the wall clock with wallclock.Now()")
			} else if id, ok := sel.X.(*ast.Ident); ok && nowVars[id.Name] {
				report(n, id.Name+"."+sel.Sel.Name+" of time.Now(): read the wall clock with wallclock.Now()")
			}
			return true
		})
	}
	return out
}
