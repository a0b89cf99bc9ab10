package client_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

func TestFileOperations(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := context.Background()
	sb := apitest.SandboxRunning

	fi, err := c.Stat(ctx, sb, apitest.PathLink)
	if err != nil || fi.Type != "SYMLINK" || fi.Symlink != "/etc" {
		t.Errorf("Stat: got %+v %v, want the link", fi, err)
	}
	fi, created, err := c.MakeDir(ctx, sb, "a/b")
	if err != nil || !created || !fi.IsDir || fi.Path != "/workspace/a/b" {
		t.Errorf("MakeDir: got %+v %v %v", fi, created, err)
	}
	if _, created, err := c.MakeDir(ctx, sb, apitest.PathExisting); err != nil || created {
		t.Errorf("MakeDir of an existing directory: got created %v, %v", created, err)
	}
	if fi, err := c.MoveFile(ctx, sb, "a.txt", "b.txt", false); err != nil || fi.Path != "/workspace/b.txt" {
		t.Errorf("MoveFile: got %+v %v", fi, err)
	}
	if _, err := c.MoveFile(ctx, sb, "a.txt", apitest.PathExisting, false); !client.IsCode(err, client.CodeAlreadyExists) {
		t.Errorf("MoveFile onto an existing path: got %v, want ALREADY_EXISTS", err)
	}
	if call := e.fake.Last("MoveFile"); call.Path != "a.txt" || call.Target != apitest.PathExisting {
		t.Errorf("the service got %+v", call)
	}
	if err := c.DeleteFile(ctx, sb, apitest.PathFull, false); !client.IsCode(err, client.CodeDirectoryNotEmpty) {
		t.Errorf("DeleteFile of a full directory: got %v, want DIRECTORY_NOT_EMPTY", err)
	}
	if err := c.DeleteFile(ctx, sb, apitest.PathFull, true); err != nil {
		t.Errorf("DeleteFile recursive: %v", err)
	}
	if !e.fake.Last("DeleteFile").Recursive {
		t.Error("the service got no recursive")
	}
}

// TestWatchFilesResumes: a REST watch whose connection drops reconnects after the last cursor
// and misses nothing; so does the GraphQL subscription.
func TestWatchFilesResumes(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := apitest.FileEventFixtures()

	e.cut.Arm(2)
	w, err := c.WatchFiles(ctx, apitest.SandboxRunning, "src", client.WatchOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, fx := range want {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if ev.Cursor != fx.Cursor || ev.Kind != string(fx.Kind) || ev.Path != fx.Path || ev.From != fx.From || ev.Missed != fx.Missed {
			t.Errorf("event %d: got %+v, want %+v", i, ev, fx)
		}
	}
	w.Close()
	if e.cut.Count() != 1 {
		t.Errorf("got %d cuts, want the one armed", e.cut.Count())
	}
	calls := e.fake.CallsTo("WatchFiles")
	if len(calls) != 2 || calls[1].Watch.After != want[1].Cursor || !calls[1].Watch.Recursive || calls[1].Watch.Path != "src" {
		t.Errorf("the service got %+v, want a resume after %s", calls, want[1].Cursor)
	}

	s, err := c.SubscribeWatchFiles(ctx, apitest.SandboxRunning, "src", client.WatchOptions{After: want[2].Cursor})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Cursor != want[3].Cursor || ev.Kind != "CREATED" || !ev.IsDir {
		t.Errorf("GraphQL after %s: got %+v %v, want %+v", want[2].Cursor, ev, err, want[3])
	}
}

func TestWatchFilesErrors(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.WatchFiles(ctx, apitest.SandboxRunning, ".", client.WatchOptions{After: apitest.WatchCursorExpired})
	if !client.IsCode(err, client.CodeCursorExpired) {
		t.Errorf("an expired cursor: got %v, want CURSOR_EXPIRED", err)
	}
	e.fake.FileEvents = []sandbox.FileEvent{{Cursor: "w0123456789abcdef.1", Kind: sandbox.FileWatchError, Code: apierror.NotFound,
		Message: "the watched folder /workspace was deleted", At: apitest.T0}}
	w, err := c.WatchFiles(ctx, apitest.SandboxRunning, ".", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Next(); !client.IsCode(err, client.CodeNotFound) {
		t.Errorf("an ERROR event: got %v, want NOT_FOUND", err)
	}
	if _, err := w.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the error: got %v, want EOF", err)
	}
	s, err := c.SubscribeWatchFiles(ctx, apitest.SandboxRunning, ".", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Next(); !client.IsCode(err, client.CodeNotFound) {
		t.Errorf("GraphQL ERROR event: got %v, want NOT_FOUND", err)
	}
}
