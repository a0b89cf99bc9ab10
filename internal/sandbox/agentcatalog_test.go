package sandbox

import (
	"strings"
	"testing"
)

func TestAgentCatalogValidation(t *testing.T) {
	good := func() AgentConfig {
		return AgentConfig{ID: "a", Integrations: []string{"sandbox"}, Binary: "a", Command: []string{"a", "{{model}}"}}
	}
	for _, tc := range []struct {
		name string
		edit func(*AgentConfig)
		want string // "" = valid
	}{
		{"valid", func(*AgentConfig) {}, ""},
		{"bad_id", func(a *AgentConfig) { a.ID = "A B" }, "id must match"},
		{"no_integrations", func(a *AgentConfig) { a.Integrations = nil }, "no integrations"},
		{"no_binary", func(a *AgentConfig) { a.Binary = "" }, "binary"},
		{"binary_with_quote", func(a *AgentConfig) { a.Binary = `a"b` }, "binary"},
		{"no_command", func(a *AgentConfig) { a.Command = nil }, "no command"},
		{"unknown_placeholder", func(a *AgentConfig) { a.Command = []string{"a", "{{modle}}"} }, "unknown placeholder {{modle}}"},
		{"timeout_too_long", func(a *AgentConfig) { a.TimeoutSec = 1 << 40 }, "timeout_sec"},
		{"reserved_env", func(a *AgentConfig) { a.Env = map[string]string{"SBX_EXEC_ID": "x"} }, "env name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := good()
			tc.edit(&a)
			l := DefaultLimits()
			agents := []AgentConfig{a}
			err := validateAgents(agents, &l)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.want == "" && agents[0].TimeoutSec != l.ExecTimeoutDefaultSec:
				t.Fatalf("default timeout: got %d, want %d", agents[0].TimeoutSec, l.ExecTimeoutDefaultSec)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
	l := DefaultLimits()
	if err := validateAgents([]AgentConfig{good(), good()}, &l); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate: got %v, want an error saying twice", err)
	}
}
