// Package designdoc checks a package's DESIGN.md against its files: the
// file table (the rows of its Markdown tables that name `.go` files) must
// name every non-test .go file of the package, and only files that exist,
// so the map a reader starts from cannot fall behind the code. A package
// uses it from a test:
//
//	func TestDesignTable(t *testing.T) { designdoc.CheckFileTable(t, ".") }
package designdoc

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// goFile is a file name in backquotes: `server.go`.
var goFile = regexp.MustCompile("`([A-Za-z0-9_.-]+\\.go)`")

// TableFiles returns the .go files named in backquotes in the table rows
// (lines starting with "|") of the Markdown file path.
func TableFiles(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("design doc: %w", err)
	}
	named := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			continue
		}
		for _, m := range goFile.FindAllStringSubmatch(line, -1) {
			named[m[1]] = true
		}
	}
	return named, nil
}

// SourceFiles returns the non-test .go files of the package in dir.
func SourceFiles(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("package dir: %w", err)
	}
	var files []string
	for _, e := range es {
		n := e.Name()
		if !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			files = append(files, n)
		}
	}
	return files, nil
}

// Problems compares dir/DESIGN.md's file table with dir's files: one line
// per file missing from the table, and per file the table names that is
// not in dir.
func Problems(dir string) ([]string, error) {
	named, err := TableFiles(filepath.Join(dir, "DESIGN.md"))
	if err != nil {
		return nil, err
	}
	files, err := SourceFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		if !named[f] {
			out = append(out, fmt.Sprintf("%s is not in DESIGN.md's file table", f))
		}
	}
	for f := range named {
		if !slices.Contains(files, f) {
			out = append(out, fmt.Sprintf("DESIGN.md's file table names %s, which is not a file of the package", f))
		}
	}
	slices.Sort(out)
	return out, nil
}

// CheckFileTable fails t for every problem Problems finds in dir.
func CheckFileTable(t testing.TB, dir string) {
	t.Helper()
	ps, err := Problems(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		t.Error(p)
	}
}
