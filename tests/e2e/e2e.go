// Package e2e is the harness of sandboxd's black-box end-to-end tests in tests/: it starts
// sandboxd processes built from this module and drives them the way a user does. RunSuite, called
// by the test package's TestMain, builds the sandboxd and sandbox-init binaries once per go test
// run and locates runsc and the rootfs; every test then starts its own sandboxd with StartServer
// (a free loopback port, its own state and checkpoint folders, a config file with the test API
// keys) and talks to it with curl-shaped REST calls (Server.Curl, Create, Exec, …) and GraphQL
// over HTTP (Server.GQL). The wire shapes here (SandboxJSON, ExecJSON, …) mirror the JSON the
// product document shows, on purpose independent of the public Go client (package client); tests
// about behaviour rather than the wire use that client instead, from Server.Client.
//
// By concern: the identities here; server.go starts and stops one sandboxd process; state.go
// its state folders; replicas.go several processes on one Redis; http.go curl-shaped exchanges
// and their checks; rest.go the REST shapes and calls; graphql.go GraphQL over HTTP; client.go
// the public Go client on a server; steps.go Eventually and Step; suite.go the suite's setup and
// its checks after the tests.
//
// SANDBOXD_E2E_KEEP=1 keeps the suite's temporary folder (server logs, configs, state folders),
// which is otherwise removed when every test passed. SANDBOXD_E2E_RACE=0 builds sandboxd without
// -race even when the tests run with it.
//
// The suite needs root, runsc and the base rootfs. scripts/test.sh exports SANDBOXD_RUNSC and
// SANDBOXD_ROOTFS; without them the suite runs scripts/ensure-runsc.sh and
// scripts/ensure-rootfs.sh itself. A missing component skips the tests, except under CI=true,
// where it fails them.
package e2e

// The API keys of every test server. SANDBOX_API_KEY (KeyDev) is the document's key: the
// development principal dev:default.
const (
	KeyDev      = "e2e-dev-key-6f1d2c3b4a59"
	KeyTenant1  = "e2e-tenant1-key-0b7e41c2d9"
	KeyTenant2  = "e2e-tenant2-key-93a5f0e8c1"
	keyPlatform = "e2e-platform-key-5c2d8e7f10"
)

// Headers, written the way curl -H takes them.
const (
	HdrJSON     = "Content-Type: application/json"
	HdrDev      = "X-Api-Key: " + KeyDev
	HdrTenant1  = "X-Api-Key: " + KeyTenant1
	HdrTenant2  = "X-Api-Key: " + KeyTenant2
	HdrPlatform = "X-Api-Key: " + keyPlatform
)

// Prefix is the root of the documented REST paths.
const Prefix = "/sandbox/sandboxes/v1"
