// Package tests holds the black-box end-to-end tests of sandboxd. TestMain hands the suite to
// package e2e (the harness), which builds the sandboxd and sandbox-init binaries once; every test
// starts its own sandboxd process and drives it the way a user does: curl-shaped REST calls from
// the product document, GraphQL over HTTP, WebSocket (graphql-transport-ws) and SSE. Sandboxes
// are real gVisor boxes run by runsc. The environment variables the suite reads are in package
// e2e's documentation.
package tests

import (
	"flag"
	"os"
	"testing"

	"sandboxd/tests/e2e"
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(e2e.RunSuite(m, e2e.SuiteOptions{Race: raceEnabled}))
}
