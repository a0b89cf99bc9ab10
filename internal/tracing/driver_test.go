package tracing_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"

	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
	"sandboxd/runtime"
	"sandboxd/runtime/runtimetest"
)

// The wrapper changes nothing a driver does: the conformance suite passes through it.
func TestTracedDriverConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return tracing.Driver(runtimetest.NewFakeT(t)) },
		runtime.BoxSpec{Profile: "test"}, runtimetest.SkipHostIsolation())
}

// exporting is a driver that reads workspaces itself.
type exporting struct{ *runtimetest.Fake }

func (exporting) ExportWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("tar")), nil
}

func (exporting) WorkspaceVersion(ctx context.Context, id, since string, settle bool) (string, bool, error) {
	return "v1", since == "v1", nil
}

func TestTracedDriverKeepsWorkspaceExporter(t *testing.T) {
	if _, ok := tracing.Driver(runtimetest.NewFakeT(t)).(runtime.WorkspaceExporter); ok {
		t.Error("the wrapper of a driver without ExportWorkspace has one")
	}
	d := tracing.Driver(exporting{runtimetest.NewFakeT(t)})
	ex, ok := d.(runtime.WorkspaceExporter)
	if !ok {
		t.Fatal("the wrapper lost the driver's ExportWorkspace")
	}
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "parent")
	rc, err := ex.ExportWorkspace(ctx, "sbx_1")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if v, unchanged, err := ex.WorkspaceVersion(ctx, "sbx_1", "v1", false); v != "v1" || !unchanged || err != nil {
		t.Errorf("WorkspaceVersion through the wrapper: %q, %v, %v", v, unchanged, err)
	}
	parent.End()
	names := spanNames(rec.Ended())
	for _, want := range []string{"driver.ExportWorkspace", "driver.WorkspaceVersion"} {
		if !strings.Contains(names, want) {
			t.Errorf("spans %s, want %s", names, want)
		}
	}
}

// Inside a trace every call is a child span with the sandbox id and the driver's name; a
// failure has the runtime error's code. Outside one (the background loops) there are none.
func TestTracedDriverSpans(t *testing.T) {
	fake := runtimetest.NewFakeT(t)
	d := tracing.Driver(fake)
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "parent")
	const id = "sbx_01TRACED"
	if err := d.Create(ctx, runtime.Record{ID: id, Tenant: "tenant-secret", Project: "proj-secret", Spec: runtime.BoxSpec{Profile: "test"}}); err != nil {
		t.Fatal(err)
	}
	defer d.Delete(context.Background(), id)
	if _, err := d.Get(ctx, "sbx_missing"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Get of a missing box: %v", err)
	}
	fake.FailNext("Stop", runtime.ErrFenced)
	if err := d.Stop(ctx, id); !errors.Is(err, runtime.ErrFenced) {
		t.Fatalf("Stop: got %v, want the injected ErrFenced", err)
	}
	rwc, err := d.Attach(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rwc.Close()
	parent.End()
	n := len(rec.Ended())

	// Outside a trace: no spans at all.
	if _, err := d.Get(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(rec.Ended()); got != n {
		t.Errorf("calls outside a trace made %d spans, want 0", got-n)
	}

	want := map[string]struct{ sandbox, code string }{
		"driver.Create": {id, ""}, "driver.Get": {"sbx_missing", "NOT_FOUND"}, "driver.Stop": {id, "FENCED"}, "driver.Attach": {id, ""},
	}
	for _, s := range rec.Ended() {
		w, ok := want[s.Name()]
		if !ok {
			continue
		}
		delete(want, s.Name())
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %v, want the caller's span", s.Name(), s.Parent().SpanID())
		}
		if got, _ := attr(s, "sandboxd.sandbox.id"); got != w.sandbox {
			t.Errorf("%s: sandbox %q, want %q", s.Name(), got, w.sandbox)
		}
		if got, _ := attr(s, "sandboxd.runtime"); got != "fake" {
			t.Errorf("%s: runtime %q, want fake", s.Name(), got)
		}
		code, _ := attr(s, "sandboxd.error.code")
		if code != w.code || (s.Status().Code == codes.Error) != (w.code != "") || s.Status().Description != w.code {
			t.Errorf("%s: code %q status %v, want %q", s.Name(), code, s.Status(), w.code)
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); strings.Contains(v, "secret") {
				t.Errorf("%s: attribute %s = %q names the tenant", s.Name(), kv.Key, v)
			}
		}
	}
	for name := range want {
		t.Errorf("no %s span", name)
	}
}

func spanNames[S interface{ Name() string }](spans []S) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// seeding is a driver that extracts workspaces itself, and exports them too.
type seeding struct {
	exporting
	seeded int
}

func (s *seeding) CreateSeeded(ctx context.Context, rec runtime.Record, seed runtime.Seed) error {
	s.seeded++
	return s.Create(ctx, rec)
}

func (s *seeding) StartSeeded(ctx context.Context, id string, seed runtime.Seed) (bool, error) {
	s.seeded++
	return s.Start(ctx, id)
}

func TestTracedDriverKeepsWorkspaceSeeder(t *testing.T) {
	if _, ok := tracing.Driver(runtimetest.NewFakeT(t)).(runtime.WorkspaceSeeder); ok {
		t.Error("the wrapper of a driver without CreateSeeded has one")
	}
	inner := &seeding{exporting: exporting{Fake: runtimetest.NewFakeT(t)}}
	d := tracing.Driver(inner)
	sd, ok := d.(runtime.WorkspaceSeeder)
	if !ok {
		t.Fatal("the wrapper lost the driver's WorkspaceSeeder")
	}
	if _, ok := d.(runtime.WorkspaceExporter); !ok {
		t.Fatal("the wrapper of an exporting seeder lost ExportWorkspace")
	}
	if _, err := sd.StartSeeded(context.Background(), "sbx_missing", nil); err == nil {
		t.Error("StartSeeded of a missing box: no error")
	}
	if inner.seeded != 1 {
		t.Errorf("StartSeeded reached the driver %d times, want 1", inner.seeded)
	}
}
