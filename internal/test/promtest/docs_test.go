package promtest_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var (
	dashboardFile = filepath.Join("..", "..", "..", "deploy", "grafana", "tollgate.json")
	operationsDoc = filepath.Join("..", "..", "..", "docs", "operations.md")
)

// dashboard is what the test reads of the Grafana dashboard.
type dashboard struct {
	Panels []struct {
		Type, Title string
		Targets     []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		}
	}
	Templating struct {
		List []struct {
			Name    string
			Options []struct{ Value string }
		}
	}
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// doors are the values of the dashboard's door variable.
func (d dashboard) doors(t *testing.T) []string {
	t.Helper()
	for _, v := range d.Templating.List {
		if v.Name == "door" {
			var out []string
			for _, o := range v.Options {
				out = append(out, o.Value)
			}
			return out
		}
	}
	t.Fatal("the dashboard has no door variable")
	return nil
}

// expand is expr as Grafana sends it: every job (the variable's All), the
// door given, and a rate interval that covers the whole load.
func expand(expr, door string) string {
	return strings.NewReplacer("$__rate_interval", "1m", "${job}", ".+", "$job", ".+", "${door}", door, "$door", door).Replace(expr)
}

// rule is one rule of tollgate.rules.yml.
type rule struct{ Record, Alert, Expr string }

func readRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Groups []struct{ Rules []rule } }
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// docs/operations.md describes every panel of the dashboard and every
// alert, in its tables.
func TestOperationsDoc(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, p := range readDashboard(t).Panels {
		if row := "| **" + p.Title + "** |"; p.Type == "row" && !strings.Contains(doc, row) {
			t.Errorf("docs/operations.md has no row %q for the dashboard's row", row)
		} else if cell := "| " + p.Title + " |"; p.Type != "row" && !strings.Contains(doc, cell) {
			t.Errorf("docs/operations.md has no row %q for the panel", cell)
		}
	}
	for _, r := range readRules(t) {
		if cell := "| `" + r.Alert + "` ("; r.Alert != "" && !strings.Contains(doc, cell) {
			t.Errorf("docs/operations.md has no row %q for the alert", cell)
		}
	}
}
