package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
)

// The tests drive the whole domain (internal/domain/domaintest): the core's verbs, with exec
// (internal/execs) to look into the workspace. They read as the package's own code, its names
// unqualified.

var alice, bob = domaintest.Alice, domaintest.Bob

func TestLifecycleRestoresALostWorkspace(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != Running || sb.Profile != "p" || sb.AutostopSec != 1800 {
		t.Fatalf("create: got %+v", sb)
	}
	// A venv-like absolute link out of the workspace must survive a restore too.
	e.MustExec(t, alice, sb.ID, "sh", "-c", "mkdir -p d && echo kept > d/f && ln -s d/f link && ln -s /usr/bin/env abs")
	if res := e.MustExec(t, alice, sb.ID, "cat", "link"); string(res.Stdout) != "kept\n" {
		t.Fatalf("second exec: got %q, want %q", res.Stdout, "kept\n")
	}
	stopped, err := e.Svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stopped.State != Stopped || stopped.LatestSnapshotID == "" {
		t.Fatalf("stop: got state %s snapshot %q, want STOPPED with a snapshot", stopped.State, stopped.LatestSnapshotID)
	}
	// The runtime loses the workspace (a node and its volume gone): start restores the checkpoint.
	if err := os.RemoveAll(e.Fake.Workspace(sb.ID)); err != nil {
		t.Fatal(err)
	}
	started, err := e.Svc.Start(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if started.State != Running {
		t.Fatalf("start: got %s, want RUNNING", started.State)
	}
	if res := e.MustExec(t, alice, sb.ID, "cat", "link"); string(res.Stdout) != "kept\n" {
		t.Fatalf("after restore: got %q, want %q", res.Stdout, "kept\n")
	}
	if res := e.MustExec(t, alice, sb.ID, "readlink", "abs"); string(res.Stdout) != "/usr/bin/env\n" {
		t.Fatalf("absolute link after restore: got %q, want %q", res.Stdout, "/usr/bin/env\n")
	}
	res, err := e.Svc.Destroy(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotID == "" || res.SnapshotID == stopped.LatestSnapshotID {
		t.Fatalf("destroy: got snapshot %q, want a new final one (previous %q)", res.SnapshotID, stopped.LatestSnapshotID)
	}
	if _, err := e.Svc.Get(ctx, alice, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("get after destroy: got %v, want NOT_FOUND", err)
	}
	// The final snapshot holds the workspace.
	r, _, err := e.Ckpt.Open(ctx, checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}, res.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil {
		t.Fatalf("reading the final snapshot: %v", err)
	}
	r.Close()
	if !bytes.Contains(buf.Bytes(), []byte("kept\n")) {
		t.Fatal("the final snapshot does not hold the workspace's file")
	}
}

func TestCorruptCheckpointFailsStart(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > early")
	good, err := e.Svc.Snapshot(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "head -c 300000 /dev/urandom > blob")
	stopped, err := e.Svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	corruptCheckpointData(t, e, checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}, stopped.LatestSnapshotID)
	if err := os.RemoveAll(e.Fake.Workspace(sb.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = e.Svc.Start(ctx, alice, sb.ID)
	ae := apierror.From(err)
	if err == nil || ae.Code != apierror.CheckpointCorrupt || !strings.Contains(ae.Message, stopped.LatestSnapshotID) ||
		!strings.Contains(ae.Message, "last good snapshot is "+good.ID) || ae.Details["last_good_snapshot_id"] != good.ID {
		t.Fatalf("start from a corrupt checkpoint: got %v (%+v), want CHECKPOINT_CORRUPT naming %s and the last good snapshot %s",
			err, ae.Details, stopped.LatestSnapshotID, good.ID)
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Failed || !strings.Contains(got.StateReason, "corrupt") {
		t.Fatalf("got %s %q, want FAILED saying the checkpoint is corrupt", got.State, got.StateReason)
	}
	if _, err := os.Stat(filepath.Join(e.Fake.Workspace(sb.ID), "blob")); err == nil {
		t.Fatal("the corrupt checkpoint's blob was extracted into the workspace")
	}
}

// corruptCheckpointData flips a byte in the middle of a checkpoint's data object, so that its
// hash no longer matches its manifest.
func corruptCheckpointData(t *testing.T, e *domaintest.Env, sc checkpoint.Scope, snapID string) {
	t.Helper()
	m, err := e.Ckpt.Get(context.Background(), sc, snapID)
	if err != nil {
		t.Fatal(err)
	}
	path, err := e.Objs.Path(m.Object)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTenancyIsNotFound(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"get": func() error { _, err := e.Svc.Get(ctx, bob, sb.ID); return err },
		"exec": func() error {
			_, err := e.Svc.Exec(ctx, bob, sb.ID, ExecRequest{Command: []string{"true"}})
			return err
		},
		"stop":    func() error { _, err := e.Svc.Stop(ctx, bob, sb.ID); return err },
		"start":   func() error { _, err := e.Svc.Start(ctx, bob, sb.ID); return err },
		"destroy": func() error { _, err := e.Svc.Destroy(ctx, bob, sb.ID); return err },
		"read":    func() error { _, _, err := e.Svc.ReadFile(ctx, bob, sb.ID, "f", 10); return err },
		"write": func() error {
			_, err := e.Svc.WriteFile(ctx, bob, sb.ID, "f", 0, strings.NewReader("x"))
			return err
		},
		"list":   func() error { _, _, err := e.Svc.ListDir(ctx, bob, sb.ID, ".", 10); return err },
		"events": func() error { _, err := domaintest.Events(ctx, e.Svc, bob, sb.ID, ""); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); apierror.CodeOf(err) != apierror.NotFound {
				t.Fatalf("got %v, want NOT_FOUND", err)
			}
		})
	}
	page, err := e.Svc.List(ctx, bob, ListOptions{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Fatalf("bob's list: got %d sandboxes, %v, want none", len(page.Sandboxes), err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Running {
		t.Fatalf("alice's sandbox after bob's attempts: got %s, want RUNNING", got.State)
	}
}

func TestConcurrentStopsOneWins(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.Svc.Stop(ctx, alice, sb.ID)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case apierror.CodeOf(err) != apierror.InvalidState:
			t.Errorf("got %v, want nil or INVALID_STATE", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d stops succeeded, want exactly 1", ok)
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Stopped {
		t.Fatalf("got %s, want STOPPED", got.State)
	}
}

func TestCrashedBoxIsFailed(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "true")
	if err := e.Fake.Kill(sb.ID, "out of memory"); err != nil {
		t.Fatal(err)
	}
	_, err = e.Svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"true"}})
	if c := apierror.CodeOf(err); c != apierror.SandboxFailed && c != apierror.InvalidState {
		t.Fatalf("exec on a crashed box: got %v, want SANDBOX_FAILED or INVALID_STATE", err)
	}
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || got.State != Failed || !strings.Contains(got.StateReason, "out of memory") {
		t.Fatalf("got %s %q %v, want FAILED with the reason", got.State, got.StateReason, err)
	}
	// A failed sandbox can be started again on its workspace.
	if got, err := e.Svc.Start(ctx, alice, sb.ID); err != nil || got.State != Running {
		t.Fatalf("start after failure: got %v %v, want RUNNING", got.State, err)
	}
	e.MustExec(t, alice, sb.ID, "true")
}

// TestLostBoxIsStartedAgain: a box whose compute was taken away (a pod deleted behind the
// control plane's back) is reported FAILED with the reason and started again on its kept
// workspace; on a full project it stays FAILED for a caller to start later.
func TestLostBoxIsStartedAgain(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 1})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > f")
	if err := e.Fake.Lose(sb.ID, "the sandbox's pod is gone"); err != nil {
		t.Fatal(err)
	}
	// No replica wrote the loss: reads see it once the read cache's copy is older than its
	// bound.
	time.Sleep(DefaultReadCacheTTL)
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || (got.State != Failed && got.State != Starting && got.State != Running) {
		t.Fatalf("right after the loss: got %s %v", got.State, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.State != Running && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got, _ = e.Svc.Get(ctx, alice, sb.ID)
	}
	if got.State != Running {
		t.Fatalf("got %s (%q), want RUNNING again", got.State, got.StateReason)
	}
	if res := e.MustExec(t, alice, sb.ID, "cat", "f"); string(res.Stdout) != "kept\n" {
		t.Errorf("after the recovery read %q, want the workspace kept", res.Stdout)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Errorf("after the recovery %d slots in use, want 1", u.InUse)
	}

	// The project's one slot taken meanwhile: the lost box stays FAILED, with the reason.
	if err := e.Fake.Lose(sb.ID, "the sandbox's pod is gone"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(DefaultReadCacheTTL)
	if _, err := e.Svc.Get(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	other, otherErr := e.Svc.Create(ctx, alice, CreateRequest{})
	WaitRecovering(e.Svc.Core)
	got, _ = e.Svc.Get(ctx, alice, sb.ID)
	if otherErr == nil {
		if got.State != Failed || !strings.Contains(got.StateReason, "pod is gone") {
			t.Errorf("with the slot taken by %s: got %s (%q), want FAILED with the reason", other.ID, got.State, got.StateReason)
		}
	} else if got.State != Running {
		// The recovery won the slot: the create was refused instead.
		t.Errorf("the create was refused (%v) but the lost box is %s", otherErr, got.State)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	e.Fake.FailNext("Create", errors.New("boom"))
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); apierror.CodeOf(err) != apierror.Unavailable {
		t.Fatalf("got %v, want UNAVAILABLE", err)
	}
	boxes, _ := e.Fake.List(ctx)
	page, _ := e.Svc.List(ctx, alice, ListOptions{})
	if len(boxes) != 0 || len(page.Sandboxes) != 0 {
		t.Fatalf("after a failed create: %d boxes, %d listed, want none", len(boxes), len(page.Sandboxes))
	}
}

func TestEventsFollowTransitions(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := domaintest.Events(ctx, e.Svc, alice, sb.ID, "0-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.Destroy(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	var got []State
	for ev := range ch {
		got = append(got, ev.State)
	}
	want := []State{Creating, Running, Destroying, Destroyed}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v (and the stream to end after DESTROYED)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestListPagesAndFilters(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if _, err := e.Svc.Stop(ctx, alice, ids[1]); err != nil {
		t.Fatal(err)
	}
	var seen []string
	cursor := ""
	for i := 0; i < 10; i++ {
		page, err := e.Svc.List(ctx, alice, ListOptions{Limit: 2, After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Sandboxes {
			seen = append(seen, s.ID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if len(seen) != 5 || seen[0] != ids[4] || seen[4] != ids[0] {
		t.Fatalf("got %v, want all five newest first", seen)
	}
	page, err := e.Svc.List(ctx, alice, ListOptions{State: Stopped})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != ids[1] {
		t.Fatalf("state filter: got %+v %v, want only %s", page.Sandboxes, err, ids[1])
	}
	if _, err := e.Svc.List(ctx, alice, ListOptions{Limit: 100000}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("huge page: got %v, want INVALID_ARGUMENT", err)
	}
}
