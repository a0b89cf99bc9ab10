package client_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
	"sandboxd/internal/tracing"
	"sandboxd/internal/tracing/tracingtest"
)

func spanAttr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// Inside a trace every guest call is a child span named by its route, with the exec's id;
// one whose answer streams ends with the stream. Command lines, paths and the guest's
// messages are never recorded; calls outside a trace make no spans.
func TestGuestCallSpans(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	if err := os.WriteFile(filepath.Join(h.WS, "secret-name.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(guesttest.Ctx(t, 30*time.Second), "parent")

	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "exec_01TRACE", Argv: []string{"sh", "-c", "echo secret-argv"}}, 0, 0)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("Run: %v %+v", err, res.Exit)
	}
	if _, err := h.C.Exec(ctx, "exec_missing"); err == nil {
		t.Fatal("Exec of a missing exec: no error")
	}
	rc, _, err := h.C.ReadFile(ctx, "secret-name.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := len(rec.Ended())
	b, _ := io.ReadAll(rc)
	if string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	if len(rec.Ended()) != n+1 {
		t.Errorf("reading a file to its end ended %d spans, want its call's 1", len(rec.Ended())-n)
	}
	rc.Close()
	// A log that is closed before its end still ends its span.
	lr, err := h.C.Log(ctx, "exec_01TRACE", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	lr.Close()
	parent.End()

	want := []struct{ name, exec, code string }{
		{"guest POST /v1/execs", "exec_01TRACE", ""},
		{"guest GET /v1/execs/{id}", "exec_missing", "NOT_FOUND"},
		{"guest GET /v1/files", "", ""},
		{"guest GET /v1/execs/{id}/log", "exec_01TRACE", ""},
	}
	var got []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() != "parent" {
			got = append(got, s)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("got %d spans, want %d", len(got), len(want))
	}
	for i, w := range want {
		s := got[i]
		if s.Name() != w.name || spanAttr(s, "sandboxd.exec.id") != w.exec || spanAttr(s, "sandboxd.error.code") != w.code {
			t.Errorf("span %d: %q exec %q code %q, want %q %q %q", i, s.Name(), spanAttr(s, "sandboxd.exec.id"),
				spanAttr(s, "sandboxd.error.code"), w.name, w.exec, w.code)
		}
		if (s.Status().Code == codes.Error) != (w.code != "") {
			t.Errorf("%s: status %v, want failed=%v", s.Name(), s.Status(), w.code != "")
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: not a child of the caller's span", s.Name())
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); strings.Contains(v, "secret") || strings.Contains(v, "sh -c") {
				t.Errorf("%s: attribute %s = %q", s.Name(), kv.Key, v)
			}
		}
	}
	if b := spanAttr(got[0], "sandboxd.guest.response_bytes"); b == "" || b == "0" {
		t.Errorf("the exec's log span counted %q bytes", b)
	}
	if b := spanAttr(got[2], "sandboxd.guest.response_bytes"); b != "5" {
		t.Errorf("the file's span counted %q bytes, want 5", b)
	}
	if got[0].EndTime().Before(got[0].StartTime()) || got[0].EndTime().IsZero() {
		t.Error("the exec's span did not end")
	}

	n = len(rec.Ended())
	if _, err := h.C.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(rec.Ended()) != n {
		t.Error("a call outside a trace made a span")
	}
	if string(tracing.KeyExecID) != "sandboxd.exec.id" || string(tracing.KeyErrorCode) != "sandboxd.error.code" {
		t.Error("guest/client's attribute keys differ from internal/tracing's")
	}
}
