package chart

import (
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"
)

// TestHelmLint runs `helm lint`'s checks (the Helm Go library's linter:
// Chart.yaml, values, templates, rendered YAML) with every values
// combination docs/kubernetes.md shows; a warning fails too.
func TestHelmLint(t *testing.T) {
	exs, err := DocExamples()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(RepoRoot(), "deploy", "helm", "lockd")
	for _, ex := range exs {
		vals := map[string]any{}
		if err := yaml.Unmarshal(ex.Values, &vals); err != nil {
			t.Fatal(err)
		}
		l := lint.All(dir, vals, "locks", false)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", ex.Name, m)
			}
		}
	}
}
