package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/tests/e2e"
)

// promNames are the metric names a PromQL expression reads: its identifiers once strings,
// label matchers, ranges, grouping clauses and function calls are taken out.
func promNames(expr string) []string {
	for _, re := range []string{`"(?:[^"\\]|\\.)*"`, `\{[^}]*\}`, `\[[^\]]*\]`,
		`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`} {
		expr = regexp.MustCompile(re).ReplaceAllString(expr, " ")
	}
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true}
	var names []string
	for _, m := range regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*\s*\(?`).FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") { // a function: rate(, sum(, histogram_quantile(, time(
			continue
		}
		if n := strings.TrimSpace(m); !keywords[n] {
			names = append(names, n)
		}
	}
	return names
}

func TestPromNames(t *testing.T) {
	got := promNames(`histogram_quantile(0.99, sum by (le, route) (rate(sandboxd_x_bucket{job=~"$job",code=~"5.."}[5m]))) / time() - max by (job) (b_total) > 0.5 and c`)
	if want := "sandboxd_x_bucket b_total c"; strings.Join(got, " ") != want {
		t.Errorf("promNames: got %q, want %q", got, want)
	}
}

// scrapeNames returns the sample names of a /metrics page.
func scrapeNames(text string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// TestMonitoringNamesRealMetrics: every expression of deploy/'s Grafana dashboard and
// PrometheusRule reads only metrics that a real sandboxd exports, from a /metrics scrape after
// a create, an exec, a refused create (quota) and a reconcile pass; and the rules have the
// alerts deploy/README.md promises, each with a severity and a summary.
func TestMonitoringNamesRealMetrics(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"quota": map[string]any{"default_limit": 1}, "reconcile_interval_ms": 200}})
	sb := s.Create(t, `{}`, e2e.HdrDev)
	s.Run(t, sb.SandboxID, []string{"true"}, e2e.HdrDev)
	r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{}`), e2e.HdrJSON, e2e.HdrDev)
	r.WantError(t, http.StatusTooManyRequests, "QUOTA_EXCEEDED", "")
	var scraped map[string]bool
	e2e.Eventually(t, 30*time.Second, "a reconcile pass in /metrics", func() (bool, string) {
		r := s.Curl(t, http.MethodGet, "/metrics", nil)
		scraped = scrapeNames(string(r.Body))
		return scraped["sandboxd_reconcile_duration_seconds_bucket"] && metricValue(string(r.Body), "sandboxd_quota_saturated_projects") == 1,
			"no reconcile pass, or no saturated project, in the scrape yet"
	})
	if v := metricValue(string(s.Curl(t, http.MethodGet, "/metrics", nil).Body), "sandboxd_quota_rejections_total"); v < 1 {
		t.Errorf("sandboxd_quota_rejections_total: got %v after a refused create, want at least 1", v)
	}

	root := filepath.Join(e2e.ModuleRoot(), "deploy", "components", "monitoring")
	check := func(where, expr string) {
		t.Helper()
		names := promNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q reads no metric", where, expr)
		}
		for _, n := range names {
			if !scraped[n] {
				t.Errorf("%s: %q reads %s, which sandboxd does not export", where, expr, n)
			}
		}
	}

	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "sandboxd-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("sandboxd-dashboard.json: %v", err)
	}
	exprs := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q: no query", p.Title)
		}
		for _, tg := range p.Targets {
			check("dashboard panel "+p.Title, tg.Expr)
			exprs++
		}
	}
	for _, v := range dash.Templating.List {
		q, _ := json.Marshal(v.Query)
		for _, n := range regexp.MustCompile(`sandboxd_[a-z_]+`).FindAllString(string(q), -1) {
			if !scraped[n] {
				t.Errorf("dashboard variable %s reads %s, which sandboxd does not export", v.Name, n)
			}
		}
	}

	var rule struct {
		Kind string
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert, Expr, For string
					Labels           map[string]string
					Annotations      map[string]string
				}
			}
		}
	}
	b, err = os.ReadFile(filepath.Join(root, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rule); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml: got kind %q", rule.Kind)
	}
	reads := map[string]bool{} // the metrics the alerts read
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			check("alert "+r.Alert, r.Expr)
			for _, n := range promNames(r.Expr) {
				reads[n] = true
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.For == "" {
				t.Errorf("alert %s: got severity %q, summary %q, for %q; want all three", r.Alert, r.Labels["severity"], r.Annotations["summary"], r.For)
			}
			exprs++
		}
	}
	// error rate, p99 of create and exec, reconciler lag, quota saturation
	for _, n := range []string{"sandboxd_http_request_duration_seconds_count", "sandboxd_lifecycle_duration_seconds_bucket",
		"sandboxd_exec_duration_seconds_bucket", "sandboxd_reconcile_last_success_timestamp_seconds",
		"sandboxd_quota_saturated_projects", "sandboxd_quota_max_utilization_ratio"} {
		if !reads[n] {
			t.Errorf("the alerts read no %s", n)
		}
	}
	t.Logf("%d expressions checked against %d exported series names", exprs, len(scraped))
}
