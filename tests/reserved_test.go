package tests

import (
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestReservedNames: the files API refuses the guest init's reserved names with a 400 naming the
// prefix, and files a command makes whose names merely start like them (.sbx-tmp-notes,
// .sbx-import-x/y) are listed and survive a stop/start and a snapshot restore.
func TestReservedNames(t *testing.T) {
	s := startServer(t, serverOptions{})
	key := hdrTenant1
	id := s.create(t, `{"profile":"sandboxes-default"}`, key).SandboxID

	step(t, "files-api-refuses", func(t *testing.T) {
		for _, c := range []struct{ method, path, prefix string }{
			{http.MethodPut, "/files?path=.sbx-tmp-x", ".sbx-tmp-"},
			{http.MethodPut, "/files?path=/workspace/a/.sbx-import-x/y", ".sbx-import-"},
			{http.MethodGet, "/files?path=.sbx-tmp-x", ".sbx-tmp-"},
			{http.MethodGet, "/files/list?path=.sbx-import-x", ".sbx-import-"},
		} {
			r := s.curl(t, c.method, prefix+"/"+id+c.path, []byte("data"), key)
			r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "reserved", c.prefix)
		}
		if out := s.run(t, id, []string{"ls", "-A", "/workspace"}, key); out != "" {
			t.Errorf("workspace after the refused calls: got %q, want empty", out)
		}
	})

	s.run(t, id, []string{"bash", "-c", "echo notes > .sbx-tmp-notes && mkdir .sbx-import-x && echo y > .sbx-import-x/y"}, key)
	want := func(t *testing.T, id, when string) {
		t.Helper()
		r := s.curl(t, http.MethodGet, prefix+"/"+id+"/files/list", nil, key)
		r.want(t, http.StatusOK)
		var l filesJSON
		r.decode(t, &l)
		var names []string
		for _, e := range l.Entries {
			names = append(names, e.Name)
		}
		if !slices.Contains(names, ".sbx-tmp-notes") || !slices.Contains(names, ".sbx-import-x") {
			t.Errorf("%s: listing got %v, want .sbx-tmp-notes and .sbx-import-x", when, names)
		}
		if out := s.run(t, id, []string{"cat", ".sbx-tmp-notes", ".sbx-import-x/y"}, key); out != "notes\ny\n" {
			t.Errorf("%s: got %q, want both files' content", when, out)
		}
	}
	want(t, id, "after the exec")

	step(t, "stop-start", func(t *testing.T) {
		s.curl(t, http.MethodPost, prefix+"/"+id+"/stop", nil, key).want(t, http.StatusOK)
		s.curl(t, http.MethodPost, prefix+"/"+id+"/start", nil, key).want(t, http.StatusOK)
		want(t, id, "after stop and start")
	})

	step(t, "snapshot-restore", func(t *testing.T) {
		r := s.curl(t, http.MethodPost, prefix+"/"+id+"/snapshots", nil, key)
		r.want(t, http.StatusCreated)
		var snap snapshotJSON
		r.decode(t, &snap)
		body := mustJSON(t, map[string]any{"profile": "sandboxes-default", "source": map[string]any{"snapshot_id": snap.SnapshotID}})
		restored := s.create(t, body, key).SandboxID
		want(t, restored, "in a sandbox created from a snapshot")
	})
}

// TestSpecialFilesRefused: reading a socket or a FIFO through the files API answers 400 naming
// the file's type, at once (a FIFO with no writer never blocks the call).
func TestSpecialFilesRefused(t *testing.T) {
	s := startServer(t, serverOptions{})
	key := hdrTenant1
	id := s.create(t, `{"profile":"sandboxes-default"}`, key).SandboxID
	s.run(t, id, []string{"python3", "-c", `import socket;s=socket.socket(socket.AF_UNIX);s.bind("/workspace/s")`}, key)
	s.run(t, id, []string{"mkfifo", "/workspace/fifo"}, key)
	for _, c := range []struct{ path, kind string }{{"s", "socket"}, {"fifo", "FIFO"}} {
		start := time.Now()
		r := s.curl(t, http.MethodGet, prefix+"/"+id+"/files?path="+c.path, nil, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.kind)
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("reading %s took %v, want an answer at once", c.path, el)
		}
		r = s.curl(t, http.MethodPut, prefix+"/"+id+"/files?path="+c.path, []byte("x"), key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.kind)
	}
}
