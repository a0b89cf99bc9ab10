package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
)

func TestLabels(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "create", "--label", "team=ml", "--label", "example.com/ticket=T-42", "--label", "empty=").want(t, exitOK)
	if got := e.ws.Last("Create").Create.Labels; len(got) != 3 || got["team"] != "ml" || got["example.com/ticket"] != "T-42" || got["empty"] != "" {
		t.Errorf("the server got labels %v, want the three flags", got)
	}
	if got := field(r.stdout, "labels"); got != "empty=, example.com/ticket=T-42, team=ml" {
		t.Errorf("create printed %q, want the labels in key order", r.stdout)
	}

	r = e.run(t, "", nil, "list", "--label", "team=ml", "--label", "env=prod").want(t, exitOK)
	if got := e.ws.Last("List").List.Labels; len(got) != 2 || got["team"] != "ml" || got["env"] != "prod" {
		t.Errorf("the server got the filter %v, want team=ml and env=prod", got)
	}
	if lines := strings.Split(r.stdout, "\n"); !strings.HasSuffix(strings.TrimSpace(lines[0]), "LABELS") || !strings.HasSuffix(strings.TrimSpace(lines[1]), " -") {
		t.Errorf("list printed %q, want a LABELS column, - for none", r.stdout)
	}

	// update: set and remove in one merge patch; the new deadlines printed.
	r = e.run(t, "", nil, "update", apitest.SandboxRunning, "--label", "env=staging", "--remove-label", "example.com/ticket",
		"--autostop-sec", "600", "--ttl-sec", "28800").want(t, exitOK)
	req := e.ws.Last("Update").Update
	if req.ClearLabels || len(req.Labels) != 2 || *req.Labels["env"] != "staging" || req.Labels["example.com/ticket"] != nil ||
		*req.AutostopSec != 600 || *req.TTLSec != 28800 {
		t.Errorf("the server got update %+v, want env set, the ticket removed, 600 and 28800", req)
	}
	for name, want := range map[string]string{"labels": "env=staging", "autostop_sec": "600", "ttl_sec": "28800", "autostop_at": "-"} {
		if got := field(r.stdout, name); got != want {
			t.Errorf("update printed %s %q, want %q (all: %q)", name, got, want, r.stdout)
		}
	}
	e.run(t, "", nil, "update", apitest.SandboxRunning, "--clear-labels").want(t, exitOK)
	if req := e.ws.Last("Update").Update; !req.ClearLabels || len(req.Labels) != 0 || req.AutostopSec != nil {
		t.Errorf("--clear-labels: the server got %+v, want labels: null alone", req)
	}
	r = e.run(t, "", nil, "-o", "json", "update", apitest.SandboxRunning, "--autostop-sec", "60").want(t, exitOK)
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.AutostopSec != 60 {
		t.Errorf("update -o json: got %q (%v), want the sandbox with autostop 60", r.stdout, err)
	}
	if r := e.run(t, "", nil, "update", "sbx_other", "--autostop-sec", "60").want(t, exitServer); !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("another tenant's sandbox: got %q, want NOT_FOUND", r.stderr)
	}

	// --clear-labels with --label: every label but those, removed by name, in one patch.
	e.cut.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/"+apitest.SandboxRunning) {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(client.Sandbox{ID: apitest.SandboxRunning, State: client.StateRunning,
			Labels: map[string]string{"team": "ml", "env": "prod", "owner": "bob"}})
		return true
	})
	e.run(t, "", nil, "update", apitest.SandboxRunning, "--clear-labels", "--label", "team=ai", "--label", "owner=bob").want(t, exitOK)
	req = e.ws.Last("Update").Update
	var removed []string
	for k, v := range req.Labels {
		if v == nil {
			removed = append(removed, k)
		}
	}
	if req.ClearLabels || !slices.Equal(removed, []string{"env"}) || *req.Labels["team"] != "ai" || *req.Labels["owner"] != "bob" {
		t.Errorf("--clear-labels --label: the server got %+v (removed %v), want env removed, team and owner set", req, removed)
	}
	e.cut.Intercept(nil)

	// A sandbox's label with control characters (a hostile server) is shown quoted.
	e.cut.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(client.Page{Sandboxes: []client.Sandbox{{ID: "sbx_x", Labels: map[string]string{"k": "\x1b]0;pwned\x07"}}}})
		return true
	})
	r = e.run(t, "", nil, "list").want(t, exitOK)
	e.cut.Intercept(nil)
	if strings.ContainsRune(r.stdout, 0x1b) || !strings.Contains(r.stdout, `"k=\x1b]0;pwned\a"`) {
		t.Errorf("list printed %q, want the label quoted", r.stdout)
	}
}

func TestLabelUsageErrors(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		name string
		args []string
		msg  string
	}{
		{"create-no-equals", []string{"create", "--label", "team"}, "--label wants KEY=VALUE"},
		{"list-empty-key", []string{"list", "--label", "=x"}, "--label wants KEY=VALUE"},
		{"list-twice", []string{"list", "--label", "a=1", "--label", "a=2"}, `names "a" twice`},
		{"update-nothing", []string{"update", apitest.SandboxRunning}, "update wants at least one of"},
		{"update-set-and-remove", []string{"update", apitest.SandboxRunning, "--label", "a=1", "--remove-label", "a"}, `both name "a"`},
		{"update-remove-kv", []string{"update", apitest.SandboxRunning, "--remove-label", "a=1"}, "--remove-label wants a KEY"},
		{"update-clear-and-remove", []string{"update", apitest.SandboxRunning, "--clear-labels", "--remove-label", "a"}, "none of the others can be"},
		{"update-no-sandbox", []string{"update", "--ttl-sec", "5"}, "wants 1 argument"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.ws.Calls())
			r := e.run(t, "", nil, tt.args...).want(t, exitUsage)
			if !strings.Contains(r.stderr, tt.msg) {
				t.Errorf("got stderr %q, want %q", r.stderr, tt.msg)
			}
			if n := len(e.ws.Calls()) - before; n != 0 {
				t.Errorf("the server got %d calls, want none", n)
			}
		})
	}
}

// field is the value of a "name:  value" line of the text output, "" when there is none.
func field(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// A server error's message that carries control characters (a name a sandbox chose) is shown
// quoted, never as escape sequences.
func TestServerErrorQuoted(t *testing.T) {
	e := newEnv(t)
	e.cut.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"NOT_FOUND","message":"path \u001b[2Jgone not found"}}`))
		return true
	})
	r := e.run(t, "", nil, "get", apitest.SandboxRunning).want(t, exitServer)
	if want := "sandboxctl: NOT_FOUND: \"path \\x1b[2Jgone not found\"\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
}
