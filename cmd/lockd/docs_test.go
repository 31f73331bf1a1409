package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the module's root, seen from this package's directory.
const repoRoot = "../.."

// docFiles lists the Markdown pages a reader follows links through: the
// README, the changelog and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "CHANGELOG.md")}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// proseLines returns a Markdown file's lines outside fenced code blocks:
// links and headings inside a block are not links or headings.
func proseLines(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// mdLink matches an inline Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// inlineCode matches a code span, whose text is never a link.
var inlineCode = regexp.MustCompile("`[^`]*`")

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range proseLines(text) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		out[slug(h)] = true
	}
	return out
}

// slug is GitHub's heading anchor: lower case, letters, digits, spaces
// turned to hyphens, hyphens and underscores kept, everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinks checks that every relative link in README.md, CHANGELOG.md
// and docs/**/*.md names a file or directory that exists and, when it
// carries an #anchor into a Markdown page, a heading of that page.
func TestDocLinks(t *testing.T) {
	checked := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(string(b)) {
			line = inlineCode.ReplaceAllString(line, "")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s (prose line %d): link %q: %v", file, n+1, target, err)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				db, err := os.ReadFile(dest)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(string(db))[anchor] {
					t.Errorf("%s (prose line %d): link %q: %s has no heading #%s", file, n+1, target, dest, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d relative links found: is the link pattern still right?", checked)
	}
}

// TestServeFlagTable checks the flag table of docs/serve.md against
// `lockd serve -h`: every flag the command has is documented, and the
// table names no flag the command lacks.
func TestServeFlagTable(t *testing.T) {
	var stderr bytes.Buffer
	m := &Main{Stdout: &stderr, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if err := m.Run(context.Background(), []string{"serve", "-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("lockd serve -h: %v", err)
	}
	var have []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(stderr.String(), -1) {
		have = append(have, m[1])
	}
	if len(have) < 20 {
		t.Fatalf("only %d flags in lockd serve -h:\n%s", len(have), stderr.String())
	}

	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "serve.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## `lockd serve` flags")
	if !ok {
		t.Fatal("docs/serve.md has no \"## `lockd serve` flags\" section")
	}
	if next := strings.Index(table, "\n## "); next >= 0 {
		table = table[:next]
	}
	var documented []string
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.Contains(cells[1], "`--") {
			continue
		}
		for _, m := range regexp.MustCompile("`--([a-z0-9-]+)`").FindAllStringSubmatch(cells[1], -1) {
			documented = append(documented, m[1])
		}
	}
	for _, f := range have {
		if !slices.Contains(documented, f) {
			t.Errorf("docs/serve.md: flag --%s of lockd serve is not in the table", f)
		}
	}
	for _, f := range documented {
		if !slices.Contains(have, f) {
			t.Errorf("docs/serve.md: the table documents --%s, which lockd serve -h does not have", f)
		}
	}
}
