package tests

import (
	"testing"

	"sandboxd/tests/e2e"
)

// Limits of the shared API server, lowered so that the caps can be reached cheaply.
const (
	apiMaxOutput = 64 << 10
	apiMaxFile   = 1 << 20
)

// apiEnv is one server and one running sandbox of tenant1 (t1:p1), shared by the groups of
// TestAPI, which run one after another.
type apiEnv struct {
	s  *e2e.Server
	id string
}

// TestAPI runs the exec, bad input, tenancy and observability groups against one server and
// one sandbox (creating a gVisor sandbox per group would cost more than the groups).
func TestAPI(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Limits: map[string]any{
		"exec_max_output_bytes": apiMaxOutput,
		"max_file_bytes":        apiMaxFile,
	}})
	sb := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1)
	e := &apiEnv{s: s, id: sb.SandboxID}
	s.Upload(t, e.id, "notes.txt", []byte("tenant1 notes\n"), e2e.HdrTenant1)

	t.Run("exec-outputs", e.testExecOutputs)
	t.Run("exec-timeout-kills-process-tree", e.testExecTimeout)
	t.Run("bad-inputs-rest", e.testBadInputsREST)
	t.Run("bad-inputs-graphql", e.testBadInputsGraphQL)
	t.Run("tenancy-rest", e.testTenancyREST)
	t.Run("tenancy-graphql", e.testTenancyGraphQL)
	t.Run("auth", e.testAuth)
	// Last: it checks the metrics of everything above.
	t.Run("health-and-metrics", e.testHealthAndMetrics)
}
