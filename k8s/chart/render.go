// Package chart renders the lockd Helm chart (deploy/helm/lockd) offline
// with the Helm Go library and decodes what it renders strictly into the
// Kubernetes API types, for the chart's tests.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// RepoRoot is the lockd repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Load loads the chart from deploy/helm/lockd.
func Load() (*chart.Chart, error) {
	return loader.Load(filepath.Join(RepoRoot(), "deploy", "helm", "lockd"))
}

// Doc is one rendered object: its template and its YAML.
type Doc struct {
	Template string
	YAML     []byte
}

// Render renders the chart with values (YAML, over the chart's defaults)
// as release name in namespace ns, and returns every non-empty object and
// NOTES.txt.
func Render(c *chart.Chart, name, ns string, values []byte) (docs []Doc, notes string, err error) {
	vals := map[string]any{}
	if err := yaml.Unmarshal(values, &vals); err != nil {
		return nil, "", fmt.Errorf("values: %w", err)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: name, Namespace: ns, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, "", fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, "", err
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasSuffix(k, "NOTES.txt") {
			notes = out[k]
			continue
		}
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(out[k], -1) {
			if len(bytes.TrimSpace(stripComments([]byte(part)))) == 0 {
				continue
			}
			docs = append(docs, Doc{Template: k, YAML: []byte(part)})
		}
	}
	return docs, notes, nil
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// Example is a values combination shown in docs/kubernetes.md: a ```yaml
// block preceded by a <!-- chart-values: NAME --> line.
type Example struct {
	Name   string
	Values []byte
}

// DocExamples returns every values combination docs/kubernetes.md shows.
func DocExamples() ([]Example, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "docs", "kubernetes.md"))
	if err != nil {
		return nil, err
	}
	re := regexp.MustCompile("(?s)<!-- chart-values: ([a-z0-9-]+) -->\\s*```yaml\\n(.*?)```")
	var out []Example
	for _, m := range re.FindAllSubmatch(b, -1) {
		out = append(out, Example{Name: string(m[1]), Values: m[2]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("docs/kubernetes.md shows no chart values")
	}
	return out, nil
}
