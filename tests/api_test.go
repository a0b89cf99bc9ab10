package tests

import (
	"testing"
)

// Limits of the shared API server, lowered so that the caps can be reached cheaply.
const (
	apiMaxOutput = 64 << 10
	apiMaxFile   = 1 << 20
)

// apiEnv is one server and one running sandbox of tenant1 (t1:p1), shared by the groups of
// TestAPI, which run one after another.
type apiEnv struct {
	s  *Server
	id string
}

// TestAPI runs the exec, bad input, tenancy and observability groups against one server and
// one sandbox (creating a gVisor sandbox per group would cost more than the groups).
func TestAPI(t *testing.T) {
	s := startServer(t, serverOptions{Limits: map[string]any{
		"exec_max_output_bytes": apiMaxOutput,
		"max_file_bytes":        apiMaxFile,
	}})
	sb := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1)
	e := &apiEnv{s: s, id: sb.SandboxID}
	s.upload(t, e.id, "notes.txt", []byte("tenant1 notes\n"), hdrTenant1)

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
