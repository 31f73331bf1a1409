package designdoc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestProblems: a file missing from the table and a row naming a file
// that is gone are both reported; test files and prose outside the table
// are not counted.
func TestProblems(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.go", "package p\n")
	write("b.go", "package p\n")
	write("a_test.go", "package p\n")
	write("DESIGN.md", "# p\n\nProse names `b.go` outside the table.\n\n| what | file |\n|---|---|\n| A | `a.go` |\n| C | `c.go`, `a.go` |\n")
	got, err := Problems(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"DESIGN.md's file table names c.go, which is not a file of the package",
		"b.go is not in DESIGN.md's file table",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems %q, want %q", got, want)
	}
	write("DESIGN.md", "| what | file |\n|---|---|\n| A, B | `a.go`, `b.go` |\n")
	if got, err := Problems(dir); err != nil || len(got) != 0 {
		t.Errorf("complete table: %q, %v", got, err)
	}
	if _, err := Problems(t.TempDir()); err == nil {
		t.Error("a package without DESIGN.md: no error")
	}
}

// TestMethodCounts: methods on T, *T and a generic type are counted per
// type; functions and test files are not.
func TestMethodCounts(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\ntype T struct{}\ntype G[K any] struct{}\n\nfunc (T) a()  {}\nfunc (*T) b() {}\nfunc (g *G[K]) c() {}\nfunc f()      {}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nfunc (T) d() {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := MethodCounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["T"] != 2 || got["G"] != 1 {
		t.Fatalf("counts: %v, want T 2, G 1", got)
	}
}
