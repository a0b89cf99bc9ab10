package tests

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// idLike matches a label value that holds a sandbox or exec id (or any ULID).
var idLike = regexp.MustCompile(`sbx_|exec_[0-9A-Z]|[0-9A-HJKMNP-TV-Z]{26}`)

// labelValue matches one label="value" of a sample.
var labelValue = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// testHealthAndMetrics: /healthz and /readyz answer 200 without a key; /metrics has the
// request, lifecycle and state metrics and never an id as a label value.
func (e *apiEnv) testHealthAndMetrics(t *testing.T) {
	s, id := e.s, e.id
	for _, path := range []string{"/healthz", "/readyz"} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			r := s.Curl(t, http.MethodGet, path, nil)
			if r.Status != http.StatusOK {
				t.Errorf("%s: got status %d, want 200", r, r.Status)
			}
		})
	}
	t.Run("metrics", func(t *testing.T) {
		// Requests whose paths carry ids, known and unknown, and paths that route nowhere.
		s.Get(t, id, e2e.HdrTenant1)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files/list", nil, e2e.HdrTenant1)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV/whatever/sbx_01ARZ3NDEKTSV4RRFFQ69G5FAW", nil, e2e.HdrTenant1)
		s.Curl(t, http.MethodGet, "/sbx_01ARZ3NDEKTSV4RRFFQ69G5FAX", nil, e2e.HdrTenant1)
		s.Curl(t, "PROPFIND", e2e.Prefix+"/"+id, nil, e2e.HdrTenant1)

		r := s.Curl(t, http.MethodGet, "/metrics", nil)
		r.Want(t, http.StatusOK)
		text := string(r.Body)
		for _, name := range []string{
			"sandboxd_http_request_duration_seconds_bucket{",
			"sandboxd_lifecycle_duration_seconds_bucket{",
			`sandboxd_sandboxes{state="RUNNING"}`,
			`sandboxd_sandboxes{state="STOPPED"}`,
			`sandboxd_sandboxes{state="FAILED"}`,
		} {
			if !strings.Contains(text, name) {
				t.Errorf("/metrics: got no %s, want it", name)
			}
		}
		if !regexp.MustCompile(`sandboxd_lifecycle_duration_seconds_count\{[^}]*operation="create"[^}]*\} [1-9]`).MatchString(text) {
			t.Errorf("/metrics: got no sandboxd_lifecycle_duration_seconds_count for operation=\"create\" with a count, want one")
		}
		if n := metricValue(text, `sandboxd_sandboxes{state="RUNNING"}`); n < 1 {
			t.Errorf("/metrics: got sandboxd_sandboxes{state=\"RUNNING\"} %v, want at least 1", n)
		}
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			_, labels, ok := strings.Cut(line, "{")
			if !ok {
				continue
			}
			for _, lv := range labelValue.FindAllStringSubmatch(labels, -1) {
				if idLike.MatchString(lv[2]) {
					t.Errorf("/metrics: got label %s=%q, which looks like an id, in %q; want bounded labels", lv[1], lv[2], line)
				}
			}
		}
		routes := map[string]bool{}
		for _, m := range regexp.MustCompile(`route="([^"]*)"`).FindAllStringSubmatch(text, -1) {
			routes[m[1]] = true
		}
		if len(routes) > 20 {
			t.Errorf("/metrics: got %d route label values %v, want a small bounded set", len(routes), routes)
		}
	})
}

// metricValue returns the value of the sample whose name and labels are series, -1 if none.
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}
