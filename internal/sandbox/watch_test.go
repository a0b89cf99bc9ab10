package sandbox_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

func TestFileOperations(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	e.MustExec(t, alice, sb.ID, "sh", "-c", "mkdir -p full/sub && echo x > full/sub/f && ln -s /etc etc && echo a > a.txt")

	fi, created, err := e.Svc.MakeDir(ctx, alice, sb.ID, "new/deep")
	if err != nil || !created || !fi.IsDir || fi.Type != FileDirectory || fi.Path != "/workspace/new/deep" {
		t.Fatalf("MakeDir: got %+v %v %v", fi, created, err)
	}
	if _, created, err := e.Svc.MakeDir(ctx, alice, sb.ID, "new/deep"); err != nil || created {
		t.Errorf("MakeDir of an existing directory: got created %v, %v; want false, nil", created, err)
	}
	fi, err = e.Svc.StatFile(ctx, alice, sb.ID, "etc")
	if err != nil || fi.Type != FileSymlink || fi.Symlink != "/etc" {
		t.Errorf("StatFile(etc): got %+v %v, want the link itself", fi, err)
	}
	fi, err = e.Svc.MoveFile(ctx, alice, sb.ID, "a.txt", "new/b.txt", false)
	if err != nil || fi.Path != "/workspace/new/b.txt" || fi.Type != FileRegular {
		t.Errorf("MoveFile: got %+v %v", fi, err)
	}
	if err := e.Svc.DeleteFile(ctx, alice, sb.ID, "full", true); err != nil {
		t.Errorf("DeleteFile(full, recursive): %v", err)
	}
	if res := e.MustExec(t, alice, sb.ID, "sh", "-c", "ls -A"); strings.Contains(string(res.Stdout), "full") {
		t.Errorf("after the delete: ls says %q", res.Stdout)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "mkdir -p full/sub && touch taken")
	for _, tc := range []struct {
		name string
		err  error
		code apierror.Code
	}{
		{"delete-not-empty", e.Svc.DeleteFile(ctx, alice, sb.ID, "full", false), apierror.DirectoryNotEmpty},
		{"move-exists", second(e.Svc.MoveFile(ctx, alice, sb.ID, "new/b.txt", "taken", false)), apierror.AlreadyExists},
		{"move-into-itself", second(e.Svc.MoveFile(ctx, alice, sb.ID, "full", "full/sub/x", false)), apierror.InvalidArgument},
		{"stat-through-link-out", second(e.Svc.StatFile(ctx, alice, sb.ID, "etc/passwd")), apierror.InvalidArgument},
		{"delete-workspace", e.Svc.DeleteFile(ctx, alice, sb.ID, "/workspace", true), apierror.InvalidArgument},
		{"stat-missing", second(e.Svc.StatFile(ctx, alice, sb.ID, "nope")), apierror.NotFound},
		{"path-too-long", second(e.Svc.StatFile(ctx, alice, sb.ID, strings.Repeat("a/", 3000))), apierror.InvalidArgument},
		// Another tenant's sandbox does not exist for it, whatever the verb.
		{"other-stat", second(e.Svc.StatFile(ctx, bob, sb.ID, "new")), apierror.NotFound},
		{"other-mkdir", second(e.Svc.MoveFile(ctx, bob, sb.ID, "new", "x", true)), apierror.NotFound},
		{"other-delete", e.Svc.DeleteFile(ctx, bob, sb.ID, "new", true), apierror.NotFound},
		{"other-watch", second(e.Svc.WatchFiles(ctx, bob, sb.ID, WatchRequest{Path: "."})), apierror.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := apierror.CodeOf(tc.err); got != tc.code {
				t.Errorf("got %v, want %s", tc.err, tc.code)
			}
		})
	}
}

func second[T any](_ T, err error) error { return err }

// nextEvents reads n events (or fails after d).
func nextEvents(t *testing.T, ch <-chan FileEvent, n int, d time.Duration) []FileEvent {
	t.Helper()
	var got []FileEvent
	timeout := time.After(d)
	for len(got) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the stream ended after %v, want %d events", got, n)
			}
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("got %v after %v, want %d events", got, d, n)
		}
	}
	return got
}

func seqOf(t *testing.T, cursor string) int {
	t.Helper()
	var id string
	var n int
	if _, err := fmt.Sscanf(strings.Replace(cursor, ".", " ", 1), "%s %d", &id, &n); err != nil {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	return n
}

// TestWatchResumesOnAnotherReplica: a subscriber of one replica goes away; one on another
// replica resumes from its last cursor and gets every event after it, none twice.
func TestWatchResumesOnAnotherReplica(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	b := e.Replica(t)
	sb := e.CreateRunning(t, alice)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Svc.WatchFiles(ctx, alice, sb.ID, WatchRequest{Path: ".", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "mkdir", "-p", "d1")
	first := nextEvents(t, ch, 1, 10*time.Second)
	if first[0].Kind != FileCreated || first[0].Path != "d1" || !first[0].IsDir {
		t.Fatalf("got %+v, want d1 created", first[0])
	}
	cancel()
	for range ch {
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "mkdir d2 && mv d2 d3 && rmdir d1")
	ch2, err := b.WatchFiles(context.Background(), alice, sb.ID, WatchRequest{Path: ".", Recursive: true, After: first[0].Cursor})
	if err != nil {
		t.Fatal(err)
	}
	got := nextEvents(t, ch2, 3, 10*time.Second)
	want := []struct {
		kind       FileEventKind
		path, from string
	}{{FileCreated, "d2", ""}, {FileMoved, "d3", "d2"}, {FileDeleted, "d1", ""}}
	for i, w := range want {
		if g := got[i]; g.Kind != w.kind || g.Path != w.path || g.From != w.from || seqOf(t, g.Cursor) != seqOf(t, first[0].Cursor)+i+1 {
			t.Errorf("event %d: got %+v, want %s %s (from %q) right after the cursor", i, g, w.kind, w.path, w.from)
		}
	}
	// A cursor of another path, a malformed one, are refused.
	if _, err := b.WatchFiles(context.Background(), alice, sb.ID, WatchRequest{Path: "d3", After: first[0].Cursor}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Errorf("another path's cursor: got %v, want INVALID_ARGUMENT", err)
	}
	if _, err := b.WatchFiles(context.Background(), alice, sb.ID, WatchRequest{After: "w12.3"}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Errorf("a malformed cursor: got %v, want INVALID_ARGUMENT", err)
	}
}

// breakingDriver lets a test break every attach stream made so far.
type breakingDriver struct {
	runtime.Driver
	mu    sync.Mutex
	conns []io.ReadWriteCloser
}

func (d *breakingDriver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	c, err := d.Driver.Attach(ctx, id)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *breakingDriver) breakAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

// TestWatchSurvivesABrokenAttach: when the replica's attach to the sandbox breaks, the
// stream reattaches and goes on after its last event; stopping the sandbox ends it with an
// ERROR event, and its cursor then names a watch that is gone.
func TestWatchSurvivesABrokenAttach(t *testing.T) {
	var drv *breakingDriver
	e := domaintest.New(t, domaintest.Options{Deps: func(d *domain.Deps) {
		drv = &breakingDriver{Driver: d.Driver}
		d.Driver = drv
	}})
	sb := e.CreateRunning(t, alice)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := e.Svc.WatchFiles(ctx, alice, sb.ID, WatchRequest{Path: "."})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "mkdir", "a")
	got := nextEvents(t, ch, 1, 10*time.Second)
	drv.breakAll()
	e.MustExec(t, alice, sb.ID, "mkdir", "b")
	got = append(got, nextEvents(t, ch, 1, 15*time.Second)...)
	if got[1].Path != "b" || seqOf(t, got[1].Cursor) != seqOf(t, got[0].Cursor)+1 {
		t.Errorf("after the broken attach: got %+v, want b right after a", got)
	}
	if _, err := e.Svc.Stop(context.Background(), alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	end := nextEvents(t, ch, 1, 40*time.Second)[0]
	if end.Kind != FileWatchError || end.Code != apierror.InvalidState {
		t.Errorf("after the stop: got %+v, want an ERROR event with INVALID_STATE", end)
	}
	if _, ok := <-ch; ok {
		t.Error("the stream went on after its ERROR event")
	}
	if _, err := e.Svc.Start(context.Background(), alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.Svc.WatchFiles(context.Background(), alice, sb.ID, WatchRequest{Path: ".", After: got[1].Cursor})
	if apierror.CodeOf(err) != apierror.CursorExpired {
		t.Errorf("a cursor from before the restart: got %v, want CURSOR_EXPIRED", err)
	}
}

func TestWatchLimits(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Config: func(c *Config) {
		c.Limits.WatchMaxPerSandbox = 2
		c.Limits.WatchMaxDirs = 3
		c.MaxStreamsPerProject = 3
	}})
	sb := e.CreateRunning(t, alice)
	other := e.CreateRunning(t, alice)
	e.MustExec(t, alice, sb.ID, "mkdir", "-p", "t/a/b/c")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := e.Svc.WatchFiles(ctx, alice, sb.ID, WatchRequest{Path: "t", Recursive: true})
	if e := apierror.From(err); e.Code != apierror.InvalidArgument || e.Details["limit_name"] != "watch_max_dirs" {
		t.Errorf("a tree over watch_max_dirs: got %v, want INVALID_ARGUMENT (watch_max_dirs)", err)
	}
	for range 2 {
		if _, err := e.Svc.WatchFiles(ctx, alice, sb.ID, WatchRequest{Path: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.Svc.WatchFiles(ctx, alice, sb.ID, WatchRequest{Path: "t"})
	if e := apierror.From(err); e.Code != apierror.LimitExceeded || e.Details["limit_name"] != "watches_per_sandbox" {
		t.Errorf("a third watch: got %v, want LIMIT_EXCEEDED (watches_per_sandbox)", err)
	}
	if _, err := e.Svc.WatchFiles(ctx, alice, other.ID, WatchRequest{Path: "."}); err != nil {
		t.Fatalf("a watch of another sandbox: %v", err)
	}
	// The project holds its three streams on this replica: a fourth is refused, another
	// project's is not.
	_, err = e.Svc.WatchFiles(ctx, alice, other.ID, WatchRequest{Path: "."})
	if e := apierror.From(err); e.Code != apierror.LimitExceeded || e.Details["limit_name"] != "streams_per_project" {
		t.Errorf("a fourth stream: got %v, want LIMIT_EXCEEDED (streams_per_project)", err)
	}
	bsb := e.CreateRunning(t, bob)
	if _, err := e.Svc.WatchFiles(ctx, bob, bsb.ID, WatchRequest{Path: "."}); err != nil {
		t.Errorf("another project's watch: %v", err)
	}
}
