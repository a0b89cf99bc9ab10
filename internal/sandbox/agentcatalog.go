package sandbox

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The agent catalog is config (Config.Agents): the coding agents a run may attach to a running
// sandbox (internal/agents starts and follows the runs). This file holds an entry's format:
// its fields, the rules New checks it against, and the command template's placeholders.

// AgentConfig is one catalog agent.
type AgentConfig struct {
	ID          string `json:"id"`
	Description string `json:"description,omitempty"`
	// Integrations are the ways the agent may run: IntegrationSandbox (attach to a running
	// sandbox: the only kind this service starts) and others, e.g. "harbor" (graded,
	// independent attempts, run elsewhere).
	Integrations []string `json:"integrations"`
	// Binary is the command the sandbox's image must contain (checked with `command -v`).
	Binary string `json:"binary"`
	// Command is the argv template. Placeholders, replaced inside each argument:
	// {{model}}, {{instruction_file}}, {{config_file}}, {{run_dir}}, {{run_id}}.
	Command []string `json:"command"`
	// TimeoutSec bounds a run (default: the exec timeout default).
	TimeoutSec int64             `json:"timeout_sec,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
}

// IntegrationSandbox is the integration kind of agents that may attach to a running sandbox.
const IntegrationSandbox = "sandbox"

var (
	placeholder = regexp.MustCompile(`\{\{[^}]*\}\}`)
	agentIDRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	knownHolder = map[string]bool{"{{model}}": true, "{{instruction_file}}": true, "{{config_file}}": true,
		"{{run_dir}}": true, "{{run_id}}": true}
)

func validateAgents(agents []AgentConfig, l *Limits) error {
	seen := map[string]bool{}
	for i := range agents {
		a := &agents[i]
		if !agentIDRe.MatchString(a.ID) {
			return fmt.Errorf("sandbox config: agent %q: id must match %s", a.ID, agentIDRe)
		}
		if seen[a.ID] {
			return fmt.Errorf("sandbox config: agent %q twice", a.ID)
		}
		seen[a.ID] = true
		if len(a.Integrations) == 0 {
			return fmt.Errorf("sandbox config: agent %q has no integrations", a.ID)
		}
		if a.Binary == "" || strings.ContainsAny(a.Binary, " \t\n'\"\\$`") {
			return fmt.Errorf("sandbox config: agent %q: binary must be a command name or path without spaces or quotes", a.ID)
		}
		if len(a.Command) == 0 {
			return fmt.Errorf("sandbox config: agent %q has no command", a.ID)
		}
		for _, arg := range a.Command {
			for _, h := range placeholder.FindAllString(arg, -1) {
				if !knownHolder[h] {
					return fmt.Errorf("sandbox config: agent %q: unknown placeholder %s (known: {{model}}, {{instruction_file}}, {{config_file}}, {{run_dir}}, {{run_id}})", a.ID, h)
				}
			}
		}
		for k := range a.Env {
			if k == "" || strings.HasPrefix(k, "SBX_") || strings.ContainsAny(k, "=\x00") {
				return fmt.Errorf("sandbox config: agent %q: env name %q is not allowed", a.ID, k)
			}
		}
		if a.TimeoutSec == 0 {
			a.TimeoutSec = l.ExecTimeoutDefaultSec
		}
		if a.TimeoutSec < 0 || a.TimeoutSec > l.ExecTimeoutMaxSec {
			return fmt.Errorf("sandbox config: agent %q: timeout_sec must be in 1..%d", a.ID, l.ExecTimeoutMaxSec)
		}
	}
	return nil
}

// UsesModel reports whether the command line takes the run's model ({{model}}): a run of such
// an agent must name one.
func (a AgentConfig) UsesModel() bool {
	return slices.ContainsFunc(a.Command, func(s string) bool { return strings.Contains(s, "{{model}}") })
}

// Render fills the command template for one run.
func (a AgentConfig) Render(model, runID, runDir string) []string {
	r := strings.NewReplacer("{{model}}", model, "{{instruction_file}}", runDir+"/instruction.md",
		"{{config_file}}", runDir+"/config.json", "{{run_dir}}", runDir, "{{run_id}}", runID)
	out := make([]string, len(a.Command))
	for i, s := range a.Command {
		out[i] = r.Replace(s)
	}
	return out
}
