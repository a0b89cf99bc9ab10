package resolvers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

const fileInfoFields = `name path size mode isDir symlink modTime type`

func TestFileOperations(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	sb := apitest.SandboxRunning
	vars := map[string]any{"s": sb}

	r := e.post(t, apitest.UserKey, `query($s: ID!) { stat(sandboxId: $s, path: "link") { `+fileInfoFields+` } }`, vars)
	noErrors(t, r)
	var fi map[string]any
	field(t, r, "stat", &fi)
	if fi["type"] != "SYMLINK" || fi["symlink"] != "/etc" || fi["isDir"] != false {
		t.Errorf("stat of a link: got %v, want type SYMLINK, symlink /etc", fi)
	}

	r = e.post(t, apitest.UserKey, `mutation($s: ID!) { makeDirectory(sandboxId: $s, path: "a/b") { created directory { path isDir type } } }`, vars)
	noErrors(t, r)
	var mk struct {
		Created   bool
		Directory struct {
			Path  string
			IsDir bool
			Type  string
		}
	}
	field(t, r, "makeDirectory", &mk)
	if !mk.Created || mk.Directory.Path != "/workspace/a/b" || !mk.Directory.IsDir || mk.Directory.Type != "DIRECTORY" {
		t.Errorf("makeDirectory: got %+v", mk)
	}

	r = e.post(t, apitest.UserKey, `mutation($s: ID!) { moveFile(sandboxId: $s, from: "a.txt", to: "b.txt") { file { path } } }`, vars)
	noErrors(t, r)
	if c := e.fake.Last("MoveFile"); c.Path != "a.txt" || c.Target != "b.txt" || c.Overwrite {
		t.Errorf("moveFile: the service got %+v", c)
	}
	r = e.post(t, apitest.UserKey, `mutation($s: ID!) { moveFile(sandboxId: $s, from: "a.txt", to: "existing", overwrite: true) { file { path } } }`, vars)
	noErrors(t, r)
	if c := e.fake.Last("MoveFile"); !c.Overwrite {
		t.Errorf("moveFile with overwrite: the service got %+v", c)
	}

	r = e.post(t, apitest.UserKey, `mutation($s: ID!) { deleteFile(sandboxId: $s, path: "full", recursive: true) { sandboxId path } }`, vars)
	noErrors(t, r)
	if c := e.fake.Last("DeleteFile"); c.Path != "full" || !c.Recursive {
		t.Errorf("deleteFile: the service got %+v", c)
	}

	for _, tc := range []struct{ name, query, code string }{
		{"delete-full", `mutation($s: ID!) { deleteFile(sandboxId: $s, path: "full") { path } }`, "DIRECTORY_NOT_EMPTY"},
		{"move-exists", `mutation($s: ID!) { moveFile(sandboxId: $s, from: "a", to: "existing") { file { path } } }`, "ALREADY_EXISTS"},
		{"stat-missing", `query($s: ID!) { stat(sandboxId: $s, path: "missing") { path } }`, "NOT_FOUND"},
		{"stat-outside", `query($s: ID!) { stat(sandboxId: $s, path: "out/x") { path } }`, "INVALID_ARGUMENT"},
		{"mkdir-outside", `mutation($s: ID!) { makeDirectory(sandboxId: $s, path: "out/x") { created } }`, "INVALID_ARGUMENT"},
		{"other-tenant", `query { stat(sandboxId: "sbx_01HXXXXXXXXXXXXXXXXXXXXXXX", path: "a") { path } }`, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(t, apitest.UserKey, tc.query, vars)
			if r.code(0) != tc.code {
				t.Errorf("got %+v, want %s", r.Errors, tc.code)
			}
		})
	}
}

// TestFileMutationsArePriced: the file mutations count as mutation fields (at most ten in one
// operation); refused whole, nothing runs.
func TestFileMutationsArePriced(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	var b strings.Builder
	b.WriteString("mutation {")
	for i := range 11 {
		fmt.Fprintf(&b, ` d%d: deleteFile(sandboxId: "%s", path: "f%d") { path }`, i, apitest.SandboxRunning, i)
	}
	b.WriteString("}")
	r := e.post(t, apitest.UserKey, b.String(), nil)
	if r.code(0) != "COST_EXCEEDED" {
		t.Fatalf("got %+v, want COST_EXCEEDED", r.Errors)
	}
	if calls := e.fake.CallsTo("DeleteFile"); len(calls) != 0 {
		t.Errorf("got %d deletes, want none", len(calls))
	}
}

const watchQuery = `subscription($s: ID!, $p: String!, $r: Boolean, $a: String) {
	watchFiles(sandboxId: $s, path: $p, recursive: $r, after: $a) { cursor kind path from isDir at missedEvents reason code message } }`

type fileEventJSON struct {
	Cursor, Kind             string
	Path, From, Reason, Code *string
	Message                  *string
	IsDir                    bool
	MissedEvents             *int64
}

func TestWatchFilesSubscription(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.FileEventsEnd = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	// subscribe returns the events and the extensions.code of an error the stream ended with.
	subscribe := func(id string, vars map[string]any) ([]fileEventJSON, string) {
		t.Helper()
		send(ctx, t, c, wsMsg{ID: id, Type: "subscribe", Payload: mustJSON(map[string]any{"query": watchQuery, "variables": vars})})
		var got []fileEventJSON
		endCode := ""
		for {
			m := next(ctx, t, c)
			if m.Type == "complete" {
				return got, endCode
			}
			if m.Type == "error" {
				t.Fatalf("got error %s", m.Payload)
			}
			if endCode != "" {
				t.Fatalf("got %s after the stream's end error, want complete", m.Payload)
			}
			var p struct {
				Data struct {
					WatchFiles *fileEventJSON
				}
				Errors []struct {
					Extensions map[string]any
				}
			}
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				t.Fatalf("got %s (%v)", m.Payload, err)
			}
			if len(p.Errors) > 0 {
				code, _ := p.Errors[0].Extensions["code"].(string)
				if code == "" || p.Data.WatchFiles != nil {
					t.Fatalf("got %s, want an error with a code and no event", m.Payload)
				}
				endCode = code
				continue
			}
			got = append(got, *p.Data.WatchFiles)
		}
	}
	// The fake's stream closes after its events without an ERROR event: a stream that broke
	// off, which ends with an UNAVAILABLE error, never a bare complete.
	got, end := subscribe("1", map[string]any{"s": apitest.SandboxRunning, "p": "src", "r": true})
	if end != "UNAVAILABLE" {
		t.Errorf("got end %q, want UNAVAILABLE", end)
	}
	if len(got) != 6 {
		t.Fatalf("got %d events %+v, want 6", len(got), got)
	}
	if m := got[2]; m.Kind != "MOVED" || *m.Path != "src/b.txt" || *m.From != "src/a.txt" {
		t.Errorf("got %+v, want the move", m)
	}
	if o := got[4]; o.Kind != "OVERFLOW" || *o.Reason != "RING" || *o.MissedEvents != 4 || o.Path != nil {
		t.Errorf("got %+v, want the overflow", o)
	}
	if w := e.fake.Last("WatchFiles").Watch; w.Path != "src" || !w.Recursive || w.After != "" {
		t.Errorf("the service got %+v", w)
	}
	got, end = subscribe("2", map[string]any{"s": apitest.SandboxRunning, "p": "src", "a": got[3].Cursor})
	if len(got) != 2 || got[0].Kind != "OVERFLOW" || end != "UNAVAILABLE" {
		t.Errorf("resumed: got %+v (end %q), want the two events after the cursor, then UNAVAILABLE", got, end)
	}
	// An ERROR event is the last: the subscription completes after it.
	e.fake.FileEvents = []sandbox.FileEvent{{Cursor: "w0123456789abcdef.1", Kind: sandbox.FileWatchError, Code: "NOT_FOUND",
		Message: "the watched folder was deleted", At: apitest.T0}}
	e.fake.FileEventsEnd = false
	got, end = subscribe("3", map[string]any{"s": apitest.SandboxRunning, "p": "."})
	if len(got) != 1 || got[0].Kind != "ERROR" || *got[0].Code != "NOT_FOUND" || *got[0].Message == "" || end != "" {
		t.Errorf("got %+v (end %q), want one ERROR event and a bare complete", got, end)
	}
	e.fake.WaitStreams(t, 5*time.Second)
}

func TestWatchFilesRefused(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	for _, tc := range []struct {
		name string
		vars map[string]any
		code string
	}{
		{"bad-cursor", map[string]any{"s": apitest.SandboxRunning, "p": ".", "a": apitest.BadCursor}, "INVALID_ARGUMENT"},
		{"expired", map[string]any{"s": apitest.SandboxRunning, "p": ".", "a": apitest.WatchCursorExpired}, "CURSOR_EXPIRED"},
		{"other-tenant", map[string]any{"s": "sbx_01HXXXXXXXXXXXXXXXXXXXXXXX", "p": "."}, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, sc := postSSEVars(t, e, apitest.UserKey, watchQuery, tc.vars)
			for _, data := range readSSE(t, sc) {
				var p struct {
					Errors []struct {
						Extensions map[string]any
					}
				}
				if err := json.Unmarshal(data, &p); err != nil || len(p.Errors) == 0 || p.Errors[0].Extensions["code"] != tc.code {
					t.Errorf("got %s, want an error with code %s", data, tc.code)
				}
			}
		})
	}
}

// ---- the fuzz service's file operations (convert_fuzz_test.go) ----

func (s *gfService) StatFile(_ context.Context, _ auth.Principal, _, path string) (sandbox.FileInfo, error) {
	s.record("StatFile", path)
	return sandbox.FileInfo{}, nil
}

func (s *gfService) MakeDir(_ context.Context, _ auth.Principal, _, path string) (sandbox.FileInfo, bool, error) {
	s.record("MakeDir", path)
	return sandbox.FileInfo{}, true, nil
}

func (s *gfService) MoveFile(_ context.Context, _ auth.Principal, _, from, to string, overwrite bool) (sandbox.FileInfo, error) {
	s.record("MoveFile", [2]string{from, to})
	return sandbox.FileInfo{}, nil
}

func (s *gfService) DeleteFile(_ context.Context, _ auth.Principal, _, path string, recursive bool) error {
	s.record("DeleteFile", path)
	return nil
}

func (s *gfService) WatchFiles(_ context.Context, _ auth.Principal, _ string, req sandbox.WatchRequest) (<-chan sandbox.FileEvent, error) {
	s.record("WatchFiles", req)
	ch := make(chan sandbox.FileEvent)
	close(ch)
	return ch, nil
}
