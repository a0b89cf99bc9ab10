package tests

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestReservedNames: the files API refuses the guest init's reserved names with a 400 naming the
// prefix, and files a command makes whose names merely start like them (.sbx-tmp-notes,
// .sbx-import-x/y) are listed and survive a stop/start and a snapshot restore.
func TestReservedNames(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrTenant1
	id := s.Create(t, `{"profile":"sandboxes-default"}`, key).SandboxID

	e2e.Step(t, "files-api-refuses", func(t *testing.T) {
		for _, c := range []struct{ method, path, prefix string }{
			{http.MethodPut, "/files?path=.sbx-tmp-x", ".sbx-tmp-"},
			{http.MethodPut, "/files?path=/workspace/a/.sbx-import-x/y", ".sbx-import-"},
			{http.MethodGet, "/files?path=.sbx-tmp-x", ".sbx-tmp-"},
			{http.MethodGet, "/files/list?path=.sbx-import-x", ".sbx-import-"},
		} {
			r := s.Curl(t, c.method, e2e.Prefix+"/"+id+c.path, []byte("data"), key)
			r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "reserved", c.prefix)
		}
		if out := s.Run(t, id, []string{"ls", "-A", "/workspace"}, key); out != "" {
			t.Errorf("workspace after the refused calls: got %q, want empty", out)
		}
	})

	s.Run(t, id, []string{"bash", "-c", "echo notes > .sbx-tmp-notes && mkdir .sbx-import-x && echo y > .sbx-import-x/y"}, key)
	want := func(t *testing.T, id, when string) {
		t.Helper()
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files/list", nil, key)
		r.Want(t, http.StatusOK)
		var l e2e.FilesJSON
		r.Decode(t, &l)
		var names []string
		for _, e := range l.Entries {
			names = append(names, e.Name)
		}
		if !slices.Contains(names, ".sbx-tmp-notes") || !slices.Contains(names, ".sbx-import-x") {
			t.Errorf("%s: listing got %v, want .sbx-tmp-notes and .sbx-import-x", when, names)
		}
		if out := s.Run(t, id, []string{"cat", ".sbx-tmp-notes", ".sbx-import-x/y"}, key); out != "notes\ny\n" {
			t.Errorf("%s: got %q, want both files' content", when, out)
		}
	}
	want(t, id, "after the exec")

	e2e.Step(t, "stop-start", func(t *testing.T) {
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, key).Want(t, http.StatusOK)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, key).Want(t, http.StatusOK)
		want(t, id, "after stop and start")
	})

	e2e.Step(t, "snapshot-restore", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/snapshots", nil, key)
		r.Want(t, http.StatusCreated)
		var snap snapshotJSON
		r.Decode(t, &snap)
		body := e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "source": map[string]any{"snapshot_id": snap.SnapshotID}})
		restored := s.Create(t, body, key).SandboxID
		want(t, restored, "in a sandbox created from a snapshot")
	})
}

// TestSpecialFilesRefused: reading a socket or a FIFO through the files API answers 400 naming
// the file's type, at once (a FIFO with no writer never blocks the call).
func TestSpecialFilesRefused(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrTenant1
	id := s.Create(t, `{"profile":"sandboxes-default"}`, key).SandboxID
	s.Run(t, id, []string{"python3", "-c", `import socket;s=socket.socket(socket.AF_UNIX);s.bind("/workspace/s")`}, key)
	s.Run(t, id, []string{"mkfifo", "/workspace/fifo"}, key)
	for _, c := range []struct{ path, kind string }{{"s", "socket"}, {"fifo", "FIFO"}} {
		start := time.Now()
		r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files?path="+c.path, nil, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.kind)
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("reading %s took %v, want an answer at once", c.path, el)
		}
		r = s.Curl(t, http.MethodPut, e2e.Prefix+"/"+id+"/files?path="+c.path, []byte("x"), key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.kind)
	}
}
