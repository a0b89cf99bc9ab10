package checkpoint_test

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"sandboxd/internal/checkpoint"
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

// Save, a restore's read and Verify are spans inside a trace: the sandbox's and the
// checkpoint's ids and sizes, never the tenant or the objects' names; a corrupt checkpoint's
// read fails its span with CORRUPT.
func TestCheckpointSpans(t *testing.T) {
	tarball, _ := smallTar(t, 7)
	st, objs := newStore(t, checkpoint.Options{})
	sc := checkpoint.Scope{Tenant: "tenant-secret", Project: "proj-secret", Sandbox: newScope().Sandbox}
	rec := tracingtest.Record(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "parent")

	m, err := st.Save(ctx, sc, bytes.NewReader(tarball), "")
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := st.Open(ctx, sc, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, err := st.Verify(ctx, sc, m.ID); err != nil {
		t.Fatal(err)
	}
	// Closed before its end: the span ends with what was read.
	rc, _, err = st.Open(ctx, sc, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Read(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	flip(t, objs, m.Object, -10)
	rc, _, err = st.Open(ctx, sc, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err == nil {
		t.Fatal("a corrupt checkpoint read without error")
	}
	rc.Close()
	if _, _, err := st.Open(ctx, sc, "snap_nope"); err == nil {
		t.Fatal("opened a checkpoint that does not exist")
	}
	parent.End()

	type row struct{ name, code, bytes, raw string }
	size, raw := strconv.FormatInt(m.Size, 10), strconv.FormatInt(m.RawSize, 10)
	want := []row{
		{"checkpoint.save", "", size, raw},
		{"checkpoint.restore", "", size, raw},
		{"checkpoint.verify", "", size, raw},
		{"checkpoint.restore", "", "", "100"},
		{"checkpoint.restore", "CORRUPT", "", "*"},
		{"checkpoint.restore", "INVALID_ARGUMENT", "", ""},
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
		r := row{s.Name(), spanAttr(s, "sandboxd.error.code"), spanAttr(s, "sandboxd.checkpoint.bytes"), spanAttr(s, "sandboxd.checkpoint.raw_bytes")}
		if w.raw == "*" && r.raw != "" {
			r.raw = "*"
		}
		if r != w {
			t.Errorf("span %d: got %+v, want %+v", i, r, w)
		}
		if (s.Status().Code == codes.Error) != (w.code != "") {
			t.Errorf("span %d %s: status %v", i, s.Name(), s.Status())
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %d %s: not a child of the caller's span", i, s.Name())
		}
		if got := spanAttr(s, "sandboxd.sandbox.id"); got != sc.Sandbox {
			t.Errorf("span %d %s: sandbox %q, want %q", i, s.Name(), got, sc.Sandbox)
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); strings.Contains(v, "secret") || strings.Contains(v, "checkpoints/") {
				t.Errorf("span %d %s: attribute %s = %q", i, s.Name(), kv.Key, v)
			}
		}
	}

	n := len(rec.Ended())
	if _, err := st.Save(context.Background(), sc, bytes.NewReader(tarball), ""); err != nil {
		t.Fatal(err)
	}
	if len(rec.Ended()) != n {
		t.Error("a save outside a trace made spans")
	}
}
