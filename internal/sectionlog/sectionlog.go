// Package sectionlog checks the critical-section logs that mutual-exclusion
// tests write: every worker appends a begin line when it enters its critical
// section and an end line when it leaves, to one O_APPEND file. A correct
// lock gives a log where every begin is followed by its own end before the
// next begin, and (for backends with fencing tokens) tokens strictly
// increase in grant order.
package sectionlog

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Format names the words of a log line: "<Begin|End> field…", where
// fields[Token] (when Token ≥ 1) is the decimal fencing token. An end line
// must repeat its begin line's fields.
type Format struct {
	// Begin and End are the keywords of a section's first and last line.
	Begin, End string
	Fields     int // words per line, the keyword included
	Token      int // index of the token word, or 0 for none
}

// Check reads the log at path and returns the number of complete critical
// sections, or an error naming the first line that breaks mutual exclusion
// or token order.
func Check(path string, f Format) (int, error) {
	file, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	var (
		open     []string // the fields of the open section, nil when none
		last     uint64
		sections int
		line     int
	)
	for sc.Scan() {
		line++
		w := strings.Fields(sc.Text())
		if len(w) != f.Fields {
			return sections, fmt.Errorf("line %d: %q: malformed", line, sc.Text())
		}
		switch w[0] {
		case f.Begin:
			if open != nil {
				return sections, fmt.Errorf("line %d: %v begins while %v is inside: overlapping critical sections", line, w[1:], open)
			}
			if f.Token > 0 {
				tok, err := strconv.ParseUint(w[f.Token], 10, 64)
				if err != nil {
					return sections, fmt.Errorf("line %d: token %q: %v", line, w[f.Token], err)
				}
				if tok <= last {
					return sections, fmt.Errorf("line %d: token %d after %d, want strictly increasing", line, tok, last)
				}
				last = tok
			}
			open = w[1:]
		case f.End:
			if !slices.Equal(open, w[1:]) {
				return sections, fmt.Errorf("line %d: end of %v while %v is inside", line, w[1:], open)
			}
			open = nil
			sections++
		default:
			return sections, fmt.Errorf("line %d: %q: malformed", line, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return sections, err
	}
	if open != nil {
		return sections, fmt.Errorf("critical section %v never ended", open)
	}
	return sections, nil
}
