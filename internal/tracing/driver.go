package tracing

import (
	"context"
	"errors"
	"io"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sandboxd/runtime"
)

// Driver wraps d so that every call of the runtime.Driver interface made inside a trace is a span
// ("driver.Create", "driver.Attach", …) with the sandbox id and the driver's name; a
// failed call records the runtime error's code (NOT_FOUND, EXISTS, NOT_RUNNING, FENCED,
// CANNOT_RUN, …). The wrapper keeps d's optional runtime.WorkspaceExporter and
// runtime.WorkspaceSeeder: it implements one exactly when d does.
func Driver(d runtime.Driver) runtime.Driver {
	t := &tracedDriver{d: d, name: KeyRuntime.String(d.Name())}
	ex, isEx := d.(runtime.WorkspaceExporter)
	sd, isSd := d.(runtime.WorkspaceSeeder)
	exp, seed := tracedExporter{t: t, ex: ex}, tracedSeeder{t: t, sd: sd}
	switch {
	case isEx && isSd:
		return struct {
			*tracedDriver
			tracedExporter
			tracedSeeder
		}{t, exp, seed}
	case isEx:
		return struct {
			*tracedDriver
			tracedExporter
		}{t, exp}
	case isSd:
		return struct {
			*tracedDriver
			tracedSeeder
		}{t, seed}
	}
	return t
}

type tracedDriver struct {
	d    runtime.Driver
	name attribute.KeyValue
}

// Unwrap returns the wrapped driver (runtime.Capability).
func (t *tracedDriver) Unwrap() runtime.Driver { return t.d }

// start starts the span of one call (inside a trace only); id is "" for calls on no one box.
func (t *tracedDriver) start(ctx context.Context, call, id string) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{t.name}
	if id != "" {
		attrs = append(attrs, KeySandboxID.String(id))
	}
	return startChild(ctx, "sandboxd/runtime", "driver."+call, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end ends span with err's code.
func end(span trace.Span, err error) {
	if err != nil {
		Fail(span, runtimeCode(err))
	}
	span.End()
}

// runtimeCode is a driver error's code.
func runtimeCode(err error) string {
	var se *runtime.StartError
	var ie *runtime.ImageError
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		return "NOT_FOUND"
	case errors.Is(err, runtime.ErrExists):
		return "EXISTS"
	case errors.Is(err, runtime.ErrNotRunning):
		return "NOT_RUNNING"
	case errors.Is(err, runtime.ErrFenced):
		return "FENCED"
	case errors.Is(err, runtime.ErrUnsupported):
		return "UNSUPPORTED"
	case errors.As(err, &ie):
		return "IMAGE"
	case errors.As(err, &se):
		return "CANNOT_RUN"
	}
	return CodeOf(err)
}

func (t *tracedDriver) Name() string { return t.d.Name() }

func (t *tracedDriver) Create(ctx context.Context, rec runtime.Record) error {
	ctx, span := t.start(ctx, "Create", rec.ID)
	err := t.d.Create(ctx, rec)
	end(span, err)
	return err
}

func (t *tracedDriver) Start(ctx context.Context, id string) (bool, error) {
	ctx, span := t.start(ctx, "Start", id)
	fresh, err := t.d.Start(ctx, id)
	span.SetAttributes(attribute.Bool("sandboxd.runtime.fresh_workspace", fresh))
	end(span, err)
	return fresh, err
}

func (t *tracedDriver) Stop(ctx context.Context, id string) error {
	ctx, span := t.start(ctx, "Stop", id)
	err := t.d.Stop(ctx, id)
	end(span, err)
	return err
}

func (t *tracedDriver) Delete(ctx context.Context, id string) error {
	ctx, span := t.start(ctx, "Delete", id)
	err := t.d.Delete(ctx, id)
	end(span, err)
	return err
}

func (t *tracedDriver) Get(ctx context.Context, id string) (runtime.Box, error) {
	ctx, span := t.start(ctx, "Get", id)
	b, err := t.d.Get(ctx, id)
	end(span, err)
	return b, err
}

func (t *tracedDriver) List(ctx context.Context) ([]runtime.Box, error) {
	ctx, span := t.start(ctx, "List", "")
	boxes, err := t.d.List(ctx)
	span.SetAttributes(attribute.Int("sandboxd.runtime.boxes", len(boxes)))
	end(span, err)
	return boxes, err
}

func (t *tracedDriver) UpdateRecord(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	ctx, span := t.start(ctx, "UpdateRecord", id)
	rec, err := t.d.UpdateRecord(ctx, id, fn)
	end(span, err)
	return rec, err
}

func (t *tracedDriver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	ctx, span := t.start(ctx, "Attach", id)
	rwc, err := t.d.Attach(ctx, id)
	end(span, err)
	return rwc, err
}

func (t *tracedDriver) Check(ctx context.Context) error {
	ctx, span := t.start(ctx, "Check", "")
	err := t.d.Check(ctx)
	end(span, err)
	return err
}

func (t *tracedDriver) Pause(ctx context.Context, id string) error {
	ctx, span := t.start(ctx, "Pause", id)
	err := t.d.Pause(ctx, id)
	end(span, err)
	return err
}

// MemoryImage's span covers opening the stream; the checkpoint's own span covers storing it.
func (t *tracedDriver) MemoryImage(ctx context.Context, id string) (io.ReadCloser, error) {
	ctx, span := t.start(ctx, "MemoryImage", id)
	rc, err := t.d.MemoryImage(ctx, id)
	end(span, err)
	return rc, err
}

func (t *tracedDriver) DropMemoryImage(ctx context.Context, id string) error {
	ctx, span := t.start(ctx, "DropMemoryImage", id)
	err := t.d.DropMemoryImage(ctx, id)
	end(span, err)
	return err
}

func (t *tracedDriver) Resume(ctx context.Context, id string, image runtime.ImageSource) error {
	ctx, span := t.start(ctx, "Resume", id)
	err := t.d.Resume(ctx, id, image)
	end(span, err)
	return err
}

// tracedExporter is the part of the wrapper of a driver that reads workspaces itself.
type tracedExporter struct {
	t  *tracedDriver
	ex runtime.WorkspaceExporter
}

// ExportWorkspace's span covers opening the stream; the checkpoint's own span covers reading it.
func (p tracedExporter) ExportWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	ctx, span := p.t.start(ctx, "ExportWorkspace", id)
	rc, err := p.ex.ExportWorkspace(ctx, id)
	end(span, err)
	return rc, err
}

func (p tracedExporter) WorkspaceVersion(ctx context.Context, id, since string, settle bool) (string, bool, error) {
	ctx, span := p.t.start(ctx, "WorkspaceVersion", id)
	v, unchanged, err := p.ex.WorkspaceVersion(ctx, id, since, settle)
	end(span, err)
	return v, unchanged, err
}

// tracedSeeder is the part of the wrapper of a driver that extracts workspaces itself.
type tracedSeeder struct {
	t  *tracedDriver
	sd runtime.WorkspaceSeeder
}

// CreateSeeded's span covers the extraction of its seed (whose checkpoint span covers the read).
func (p tracedSeeder) CreateSeeded(ctx context.Context, rec runtime.Record, seed runtime.Seed) error {
	ctx, span := p.t.start(ctx, "CreateSeeded", rec.ID)
	err := p.sd.CreateSeeded(ctx, rec, seed)
	end(span, err)
	return err
}

func (p tracedSeeder) StartSeeded(ctx context.Context, id string, seed runtime.Seed) (bool, error) {
	ctx, span := p.t.start(ctx, "StartSeeded", id)
	fresh, err := p.sd.StartSeeded(ctx, id, seed)
	end(span, err)
	return fresh, err
}
