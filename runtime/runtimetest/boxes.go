package runtimetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// NewRecord returns a record with a fresh id for spec, as the domain would create it.
func NewRecord(spec runtime.BoxSpec) runtime.Record {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return runtime.Record{
		ID:             NewID(),
		Tenant:         "tenant-a",
		Project:        "project-a",
		Spec:           spec,
		State:          "CREATING",
		DesiredState:   "RUNNING",
		AutostopSec:    1800,
		TTLSec:         86400,
		CreatedAt:      now,
		StateChangedAt: now,
		Annotations:    map[string]string{"created-by": "runtimetest"},
		Labels:         map[string]string{"suite": "conformance", "example.com/tier": "gold", "empty": ""},
	}
}

// CreateBox creates a box from spec and deletes it when the test ends.
func CreateBox(t testing.TB, d runtime.Driver, spec runtime.BoxSpec) string {
	t.Helper()
	rec := NewRecord(spec)
	if err := d.Create(ctxT(t), rec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { deleteBox(t, d, rec.ID) })
	return rec.ID
}

// Client attaches to a running box and returns a guest client over the attach; both are
// closed when the test ends.
func Client(t testing.TB, d runtime.Driver, id string) *client.Client {
	t.Helper()
	rwc, err := d.Attach(ctxT(t), id)
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	c, err := client.DialContext(ctxT(t), rwc) // owns rwc from here
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// MustRun runs req (with a fresh id when it has none) and fails the test when the call fails.
func MustRun(t testing.TB, c *client.Client, req proto.ExecRequest) client.RunResult {
	t.Helper()
	if req.ID == "" {
		req.ID = NewExecID()
	}
	res, err := c.Run(ctxT(t), req, 1<<20, 1<<20)
	if err != nil {
		t.Fatalf("Run %q: %v", req.Argv, err)
	}
	return res
}

func mustGet(t testing.TB, d runtime.Driver, id string) runtime.Box {
	t.Helper()
	b, err := d.Get(ctxT(t), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return b
}

func deleteBox(t testing.TB, d runtime.Driver, id string) {
	t.Helper()
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete %s: %v", id, err)
	}
}

// ctxT bounds one driver call of the suite. It does not derive from t.Context(), which ends
// before the test's cleanups (that delete boxes) run.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
