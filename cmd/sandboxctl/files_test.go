package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

func TestFileCommands(t *testing.T) {
	e := newEnv(t)
	sb := apitest.SandboxRunning

	e.run(t, "", nil, "rm", sb+":a.txt", sb+":/workspace/b").want(t, exitOK)
	calls := e.ws.CallsTo("DeleteFile")
	if len(calls) != 2 || calls[0].Path != "a.txt" || calls[1].Path != "/workspace/b" || calls[0].Recursive {
		t.Errorf("rm: the server got %+v, want a.txt and /workspace/b, not recursive", calls)
	}
	if r := e.run(t, "", nil, "rm", sb+":"+apitest.PathFull).want(t, exitServer); !strings.Contains(r.stderr, "DIRECTORY_NOT_EMPTY") {
		t.Errorf("rm of a full folder: %q, want DIRECTORY_NOT_EMPTY", r.stderr)
	}
	e.run(t, "", nil, "rm", "-r", sb+":"+apitest.PathFull).want(t, exitOK)
	if c := e.ws.Last("DeleteFile"); !c.Recursive {
		t.Errorf("rm -r: the server got %+v, want recursive", c)
	}

	e.run(t, "", nil, "mv", sb+":a.txt", "b.txt").want(t, exitOK)
	if c := e.ws.Last("MoveFile"); c.Path != "a.txt" || c.Target != "b.txt" || c.Overwrite {
		t.Errorf("mv: the server got %+v, want a.txt to b.txt", c)
	}
	if r := e.run(t, "", nil, "mv", sb+":a.txt", sb+":"+apitest.PathExisting).want(t, exitServer); !strings.Contains(r.stderr, "ALREADY_EXISTS") {
		t.Errorf("mv onto an existing path: %q, want ALREADY_EXISTS", r.stderr)
	}
	r := e.run(t, "", nil, "-o", "json", "mv", "-f", sb+":a.txt", sb+":"+apitest.PathExisting).want(t, exitOK)
	var fi client.FileInfo
	if err := json.Unmarshal([]byte(r.stdout), &fi); err != nil || fi.Path != "/workspace/"+apitest.PathExisting || !e.ws.Last("MoveFile").Overwrite {
		t.Errorf("mv -f -o json: got %q (%v), want the moved file, overwrite", r.stdout, err)
	}

	e.run(t, "", nil, "mkdir", sb+":x/y/z").want(t, exitOK)
	if n, ok := e.ws.Entry("x/y/z"); !ok || !n.Dir {
		t.Errorf("mkdir: got %+v (%v), want the folder made", n, ok)
	}
	r = e.run(t, "", nil, "-o", "json", "mkdir", sb+":x/y").want(t, exitOK)
	var made struct {
		Path    string `json:"path"`
		Created bool   `json:"created"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &made); err != nil || made.Path != "/workspace/x/y" || made.Created {
		t.Errorf("mkdir of an existing folder -o json: got %q (%v), want created false", r.stdout, err)
	}

	e.ws.Put("d/f.txt", apitest.Node{Data: []byte("hello"), Mode: 0o640})
	e.ws.Put("d/\x1b]0;pwned\x07", apitest.Node{Link: "\x1b[2J"})
	r = e.run(t, "", nil, "stat", sb+":d/f.txt").want(t, exitOK)
	for name, want := range map[string]string{"path": "/workspace/d/f.txt", "type": "FILE", "size": "5 (5 B)", "mode": "0640"} {
		if got := field(r.stdout, name); got != want {
			t.Errorf("stat printed %s %q, want %q (all: %q)", name, got, want, r.stdout)
		}
	}
	r = e.run(t, "", nil, "stat", sb+":d/\x1b]0;pwned\x07").want(t, exitOK)
	if strings.ContainsRune(r.stdout, 0x1b) || field(r.stdout, "type") != "SYMLINK" || field(r.stdout, "symlink") != `"\x1b[2J"` {
		t.Errorf("stat of a link with escapes: %q, want it quoted", r.stdout)
	}
	if r := e.run(t, "", nil, "stat", sb+":../etc/passwd").want(t, exitServer); !strings.Contains(r.stderr, "INVALID_ARGUMENT") {
		t.Errorf("stat out of the workspace: %q, want INVALID_ARGUMENT", r.stderr)
	}

	for _, tt := range []struct {
		args []string
		msg  string
	}{
		{[]string{"rm", "local.txt"}, "wants SANDBOX:PATH"},
		{[]string{"mkdir", sb + ":a", "./b"}, "wants SANDBOX:PATH"},
		{[]string{"mv", sb + ":a", "sbx_other:b"}, "within one sandbox"},
		{[]string{"stat"}, "wants 1 argument"},
	} {
		if r := e.run(t, "", nil, tt.args...).want(t, exitUsage); !strings.Contains(r.stderr, tt.msg) {
			t.Errorf("%v: got %q, want %q", tt.args, r.stderr, tt.msg)
		}
	}
	for _, args := range [][]string{{"rm", "sbx_other:a"}, {"mv", "sbx_other:a", "b"}, {"mkdir", "sbx_other:a"}, {"stat", "sbx_other:a"}, {"watch", "sbx_other:"}} {
		if r := e.run(t, "", nil, args...).want(t, exitServer); !strings.Contains(r.stderr, "NOT_FOUND") {
			t.Errorf("%v: got %q, want NOT_FOUND", args, r.stderr)
		}
	}
}

func fileEvents() []sandbox.FileEvent {
	return []sandbox.FileEvent{
		{Cursor: "w.1", Kind: sandbox.FileCreated, Path: "src", IsDir: true, At: apitest.T0},
		{Cursor: "w.2", Kind: sandbox.FileModified, Path: "src/a.go", At: apitest.T0},
		{Cursor: "w.3", Kind: sandbox.FileMoved, From: "src/a.go", Path: "src/b.go", At: apitest.T0},
		{Cursor: "w.4", Kind: sandbox.FileDeleted, Path: "src/\x1b[2Jx", At: apitest.T0},
		{Cursor: "w.5", Kind: sandbox.FileOverflow, Reason: "QUEUE", Missed: 7, At: apitest.T0},
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	e.ws.FileEvents = fileEvents()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout syncBuffer
	go func() {
		for !strings.Contains(stdout.String(), "rescan") {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	r := e.runCtx(t, ctx, "", nil, &stdout, nil, "watch", apitest.SandboxRunning+":src", "-r").want(t, exitInterrupted)
	at := apitest.T0.Format(time.RFC3339)
	want := at + "  w.1  CREATED   src/\n" +
		at + "  w.2  MODIFIED  src/a.go\n" +
		at + "  w.3  MOVED     src/a.go -> src/b.go\n" +
		at + "  w.4  DELETED   \"src/\\x1b[2Jx\"\n" +
		at + "  w.5  OVERFLOW  7 events lost (QUEUE); rescan\n"
	if r.stdout != want {
		t.Errorf("got stdout\n%s\nwant\n%s", r.stdout, want)
	}
	if want := "sandboxctl: stopped; resume: sandboxctl watch " + apitest.SandboxRunning + ":src -r --after w.5\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
	if c := e.ws.Last("WatchFiles"); c.Path != "src" || !c.Watch.Recursive || c.Watch.After != "" {
		t.Errorf("the server got %+v, want src, recursive, from now", c)
	}

	// Resume after a cursor, as JSON lines; Ctrl-C ends them with a stopped line.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	stdout = syncBuffer{}
	go func() {
		for !strings.Contains(stdout.String(), `"w.5"`) {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	r = e.runCtx(t, ctx, "", nil, &stdout, nil, "-o", "json", "watch", apitest.SandboxRunning+":src", "--after", "w.3").want(t, exitInterrupted)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var ev, stopped fileEventJSON
	if len(lines) != 3 || json.Unmarshal([]byte(lines[0]), &ev) != nil || ev.Event != "deleted" || ev.Cursor != "w.4" || ev.Path != "src/\x1b[2Jx" ||
		json.Unmarshal([]byte(lines[2]), &stopped) != nil || stopped.Event != "stopped" || stopped.Cursor != "w.5" {
		t.Errorf("watch --after w.3 -o json: got %q, want w.4, w.5 and stopped at w.5", r.stdout)
	}
	if c := e.ws.Last("WatchFiles"); c.Watch.After != "w.3" {
		t.Errorf("the server got after %q, want w.3", c.Watch.After)
	}
	if r.stderr != "" {
		t.Errorf("got stderr %q, want nothing (JSON carries it)", r.stderr)
	}
	if r := e.run(t, "", nil, "watch", apitest.SandboxRunning+":src", "--after", "w.99").want(t, exitServer); !strings.Contains(r.stderr, "CURSOR_EXPIRED") {
		t.Errorf("an unknown cursor: %q, want CURSOR_EXPIRED", r.stderr)
	}

	// A watch the sandbox ends (its folder deleted) ends the command with the reason.
	e.ws.FileEvents = append(fileEvents()[:1], sandbox.FileEvent{Cursor: "w.2", Kind: sandbox.FileWatchError, Code: apierror.NotFound,
		Message: "the watched folder src was deleted", At: apitest.T0})
	r = e.run(t, "", nil, "watch", apitest.SandboxRunning+":src").want(t, exitServer)
	if !strings.Contains(r.stdout, "CREATED   src/") || r.stderr != "sandboxctl: NOT_FOUND: the watched folder src was deleted\n" {
		t.Errorf("a watch the server ended: got %q / %q, want the event, then the reason", r.stdout, r.stderr)
	}
}
