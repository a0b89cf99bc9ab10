package rest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestFileOps(t *testing.T) {
	f := apitest.New()
	h := newTestHandler(t, f)
	base := Prefix + "/" + apitest.SandboxRunning + "/files"

	rec := serve(t, h, http.MethodGet, base+"/stat?path="+apitest.PathLink, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("stat: got %d %s", rec.Code, rec.Body)
	}
	m := decodeObject(t, rec.Body.Bytes())
	if m["type"] != "SYMLINK" || m["symlink"] != "/etc" || m["is_dir"] != false || m["mode"] != "0777" {
		t.Errorf("stat of a link: got %v, want type SYMLINK, symlink /etc, mode 0777", m)
	}

	rec = serve(t, h, http.MethodPost, base+"/mkdir?path=a/b", "")
	if rec.Code != http.StatusCreated {
		t.Fatalf("mkdir: got %d %s, want 201", rec.Code, rec.Body)
	}
	if m := decodeObject(t, rec.Body.Bytes()); m["created"] != true || m["is_dir"] != true || m["path"] != "/workspace/a/b" {
		t.Errorf("mkdir: got %v", m)
	}
	rec = serve(t, h, http.MethodPost, base+"/mkdir?path="+apitest.PathExisting, "{}")
	if m := decodeObject(t, rec.Body.Bytes()); rec.Code != http.StatusOK || m["created"] != false {
		t.Errorf("mkdir of an existing directory: got %d %v, want 200, created false", rec.Code, m)
	}

	rec = serve(t, h, http.MethodPost, base+"/move", `{"from":"a.txt","to":"b.txt"}`)
	if m := decodeObject(t, rec.Body.Bytes()); rec.Code != http.StatusOK || m["path"] != "/workspace/b.txt" {
		t.Errorf("move: got %d %v", rec.Code, m)
	}
	if c := f.Last("MoveFile"); c.Path != "a.txt" || c.Target != "b.txt" || c.Overwrite {
		t.Errorf("move: the service got %+v, want a.txt → b.txt without overwrite", c)
	}
	serve(t, h, http.MethodPost, base+"/move", `{"from":"a.txt","to":"existing","overwrite":true}`)
	if c := f.Last("MoveFile"); !c.Overwrite {
		t.Errorf("move with overwrite: the service got %+v", c)
	}

	rec = serve(t, h, http.MethodDelete, base+"?path=dir&recursive=true", "")
	if m := decodeObject(t, rec.Body.Bytes()); rec.Code != http.StatusOK || m["deleted"] != true || m["path"] != "dir" {
		t.Errorf("delete: got %d %v", rec.Code, m)
	}
	if c := f.Last("DeleteFile"); c.Path != "dir" || !c.Recursive {
		t.Errorf("delete: the service got %+v, want dir recursively", c)
	}
	serve(t, h, http.MethodDelete, base+"?path=f", "")
	if c := f.Last("DeleteFile"); c.Recursive {
		t.Errorf("delete without recursive: the service got %+v", c)
	}

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     apierror.Code
	}{
		{"delete-full", http.MethodDelete, base + "?path=" + apitest.PathFull, "", http.StatusConflict, apierror.DirectoryNotEmpty},
		{"delete-bad-recursive", http.MethodDelete, base + "?path=x&recursive=yes", "", http.StatusBadRequest, apierror.InvalidArgument},
		{"delete-outside", http.MethodDelete, base + "?path=" + apitest.PathOutside + "&recursive=1", "", http.StatusBadRequest, apierror.InvalidArgument},
		{"move-exists", http.MethodPost, base + "/move", `{"from":"a","to":"existing"}`, http.StatusConflict, apierror.AlreadyExists},
		{"move-missing-to", http.MethodPost, base + "/move", `{"from":"a"}`, http.StatusBadRequest, apierror.InvalidArgument},
		{"move-unknown-field", http.MethodPost, base + "/move", `{"from":"a","to":"b","force":true}`, http.StatusBadRequest, apierror.InvalidArgument},
		{"move-not-json", http.MethodPost, base + "/move", `from=a`, http.StatusBadRequest, apierror.InvalidArgument},
		{"stat-missing", http.MethodGet, base + "/stat?path=" + apitest.PathMissing, "", http.StatusNotFound, apierror.NotFound},
		{"mkdir-with-body", http.MethodPost, base + "/mkdir?path=x", `{"path":"x"}`, http.StatusBadRequest, apierror.InvalidArgument},
		{"other-tenant", http.MethodGet, Prefix + "/sbx_01HXXXXXXXXXXXXXXXXXXXXXXX/files/stat?path=a", "", http.StatusNotFound, apierror.NotFound},
		{"watch-bad-cursor", http.MethodGet, base + "/watch?after=" + apitest.BadCursor, "", http.StatusBadRequest, apierror.InvalidArgument},
		{"watch-expired", http.MethodGet, base + "/watch?after=" + apitest.WatchCursorExpired, "", http.StatusGone, apierror.CursorExpired},
		{"watch-bad-recursive", http.MethodGet, base + "/watch?recursive=2", "", http.StatusBadRequest, apierror.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, serve(t, h, tc.method, tc.path, tc.body), tc.status, string(tc.code))
		})
	}
}

// TestWatchFilesSSE: events go out with their cursors as ids; a reconnect with Last-Event-ID
// (or ?after=) goes on right after it; an error event ends the stream.
func TestWatchFilesSSE(t *testing.T) {
	f := apitest.New()
	f.FileEventsEnd = true
	srv := httptest.NewServer(newTestHandler(t, f))
	defer srv.Close()
	url := srv.URL + Prefix + "/" + apitest.SandboxRunning + "/files/watch?path=src&recursive=true"
	get := func(t *testing.T, headers ...string) []sseEvent {
		t.Helper()
		resp, err := http.DefaultClient.Do(newRequest(t, context.Background(), http.MethodGet, url, nil, headers...))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("got %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return readEvents(t, resp.Body, nil)
	}
	evs := get(t)
	if len(evs) != 6 {
		t.Fatalf("got %d events %+v, want 6", len(evs), evs)
	}
	want := []struct{ id, event, data string }{
		{"w0123456789abcdef.1", "created", `{"path":"src/a.txt","is_dir":false,"at":"2025-01-02T03:04:05Z"}`},
		{"w0123456789abcdef.3", "moved", `{"path":"src/b.txt","from":"src/a.txt","is_dir":false,"at":"2025-01-02T03:04:05Z"}`},
		{"w0123456789abcdef.9", "overflow", `{"is_dir":false,"at":"2025-01-02T03:04:05Z","missed":4,"reason":"RING"}`},
	}
	for _, w := range want {
		found := false
		for _, e := range evs {
			if e.ID == w.id {
				found = true
				if e.Event != w.event || e.Data != w.data {
					t.Errorf("event %s: got %s %s, want %s %s", w.id, e.Event, e.Data, w.event, w.data)
				}
			}
		}
		if !found {
			t.Errorf("no event %s", w.id)
		}
	}
	if c := f.Last("WatchFiles"); c.Watch.Path != "src" || !c.Watch.Recursive || c.Watch.After != "" {
		t.Errorf("the service got %+v", c.Watch)
	}
	evs = get(t, "Last-Event-ID", "w0123456789abcdef.4")
	if len(evs) != 2 || evs[0].ID != "w0123456789abcdef.9" {
		t.Errorf("resumed after .4: got %+v, want the overflow and the deletion", evs)
	}
	url += "&after=w0123456789abcdef.9"
	evs = get(t, "Last-Event-ID", "w0123456789abcdef.1") // ?after= wins
	if len(evs) != 1 || evs[0].Event != "deleted" {
		t.Errorf("resumed after .9: got %+v, want the deletion", evs)
	}

	f.FileEvents = append(apitest.FileEventFixtures()[:1], sandbox.FileEvent{Cursor: "w0123456789abcdef.1", Kind: sandbox.FileWatchError,
		Code: apierror.InvalidState, Message: "the sandbox is STOPPED", At: apitest.T0})
	f.FileEventsEnd = false // the error ends the stream by itself
	url = srv.URL + Prefix + "/" + apitest.SandboxRunning + "/files/watch"
	evs = get(t)
	if len(evs) != 2 || evs[1].Event != "error" || evs[1].Data != `{"code":"INVALID_STATE","message":"the sandbox is STOPPED"}` {
		t.Errorf("got %+v, want a created event, then the error that ends the stream", evs)
	}
	f.WaitStreams(t, 5*time.Second)
}

// TestWatchFilesKeepAlive: an idle watch stream gets keepalive comments; a client that goes
// away ends the service's stream.
func TestWatchFilesKeepAlive(t *testing.T) {
	f := apitest.New()
	f.FileEvents = nil
	h := newTestHandler(t, f)
	h.keepAlive = 20 * time.Millisecond
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := http.DefaultClient.Do(newRequest(t, ctx, http.MethodGet, srv.URL+Prefix+"/"+apitest.SandboxRunning+"/files/watch", nil))
	if err != nil {
		t.Fatal(err)
	}
	evs := readEvents(t, resp.Body, func(e sseEvent) bool { return e.Comment == "keepalive" })
	if len(evs) == 0 || evs[len(evs)-1].Comment != "keepalive" {
		t.Errorf("got %+v, want a keepalive", evs)
	}
	cancel()
	resp.Body.Close()
	f.WaitStreams(t, 5*time.Second)
}

// ---- the fuzz service's file operations (decode_fuzz_test.go) ----

func (s *fzService) StatFile(_ context.Context, _ auth.Principal, _, path string) (sandbox.FileInfo, error) {
	s.record("StatFile", path)
	return sandbox.FileInfo{}, nil
}

func (s *fzService) MakeDir(_ context.Context, _ auth.Principal, _, path string) (sandbox.FileInfo, bool, error) {
	s.record("MakeDir", path)
	return sandbox.FileInfo{}, true, nil
}

func (s *fzService) MoveFile(_ context.Context, _ auth.Principal, _, from, to string, overwrite bool) (sandbox.FileInfo, error) {
	s.record("MoveFile", moveBody{From: from, To: to, Overwrite: overwrite})
	return sandbox.FileInfo{}, nil
}

func (s *fzService) DeleteFile(_ context.Context, _ auth.Principal, _, path string, recursive bool) error {
	s.record("DeleteFile", path)
	return nil
}

func (s *fzService) WatchFiles(_ context.Context, _ auth.Principal, _ string, req sandbox.WatchRequest) (<-chan sandbox.FileEvent, error) {
	s.record("WatchFiles", req)
	ch := make(chan sandbox.FileEvent)
	close(ch)
	return ch, nil
}
