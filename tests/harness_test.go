package tests

// The harness, by concern: the identities here; harness_server_test.go starts and stops one
// sandboxd process; harness_state_test.go its state folders; harness_replicas_test.go several
// processes on one Redis; harness_http_test.go curl-shaped exchanges and their checks;
// harness_rest_test.go the REST shapes and calls; harness_graphql_test.go GraphQL over HTTP;
// harness_steps_test.go eventually and step.

// The API keys of every test server. SANDBOX_API_KEY (keyDev) is the document's key: the
// development principal dev:default.
const (
	keyDev      = "e2e-dev-key-6f1d2c3b4a59"
	keyTenant1  = "e2e-tenant1-key-0b7e41c2d9"
	keyTenant2  = "e2e-tenant2-key-93a5f0e8c1"
	keyPlatform = "e2e-platform-key-5c2d8e7f10"
)

// Headers, written the way curl -H takes them.
const (
	hdrJSON     = "Content-Type: application/json"
	hdrDev      = "X-Api-Key: " + keyDev
	hdrTenant1  = "X-Api-Key: " + keyTenant1
	hdrTenant2  = "X-Api-Key: " + keyTenant2
	hdrPlatform = "X-Api-Key: " + keyPlatform
)

// prefix is the root of the documented REST paths.
const prefix = "/sandbox/sandboxes/v1"
