package sandbox

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
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/events"
	"sandboxd/internal/execstream"
	"sandboxd/internal/quota"
	"sandboxd/internal/redistest"
	"sandboxd/internal/store"
	"sandboxd/runtime/runtimetest"
)

var (
	alice = auth.Principal{Key: "a", Tenant: "t1", Project: "p1"}
	bob   = auth.Principal{Key: "b", Tenant: "t2", Project: "p1"}
)

type env struct {
	svc   *Service
	fake  *runtimetest.Fake
	ckpt  *checkpoint.Store
	objs  *checkpoint.LocalStore
	redis *redistest.Server
	clock *fakeClock

	cfg     Config
	newDeps func() Deps
}

// fakeClock is the service's clock in tests: real time plus an offset the test advances.
type fakeClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// newEnv wires the real service over the fake driver (real guest server on the host), the
// embedded Redis and a local checkpoint folder.
func newEnv(t *testing.T) *env { return newEnvWithLimit(t, 0) }

// newEnvWithLimit is newEnv with a concurrency limit per project (0: unlimited).
func newEnvWithLimit(t *testing.T, limit int) *env { return newEnvWith(t, envOptions{limit: limit}) }

// envOptions adjust newEnvWith's service.
type envOptions struct {
	// limit is the concurrency limit per project (0: unlimited).
	limit int
	// config adjusts the config; deps adjusts the deps of every replica.
	config func(*Config)
	deps   func(*Deps)
	// realRedis runs a redis-server instead of the embedded Redis.
	realRedis bool
}

// newEnvWith is newEnv with opts.
func newEnvWith(t *testing.T, opts envOptions) *env {
	t.Helper()
	limit := opts.limit
	fake := runtimetest.NewFakeT(t)
	rs := redistest.Embedded(t)
	if opts.realRedis {
		rs = redistest.Start(t)
	}
	objs, err := checkpoint.NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ck := checkpoint.New(objs, checkpoint.Options{})
	st := store.New(rs.Client, func(ctx context.Context) ([]store.Entry, error) {
		boxes, err := fake.List(ctx)
		if err != nil {
			return nil, err
		}
		var out []store.Entry
		for _, b := range boxes {
			out = append(out, EntryOf(b))
		}
		return out, nil
	})
	cfg := Config{Profiles: []ProfileConfig{{Name: "p", MemoryMB: 64}}, Limits: DefaultLimits(), LockTTL: 3 * time.Second}
	clock := &fakeClock{}
	q := quota.New(rs.Client, SlotSource(fake), quota.Options{Limits: quota.Limits{Default: limit}, Lease: time.Minute,
		Settle: -1, Now: clock.Now})
	e := &env{fake: fake, ckpt: ck, objs: objs, redis: rs, clock: clock}
	e.newDeps = func() Deps {
		d := Deps{Driver: fake, Store: st, Events: events.New(rs.Client, events.Options{MaxLen: 100}), Checkpoints: ck,
			Execs: execstream.New(rs.Client, execstream.Options{Now: clock.Now, Block: 200 * time.Millisecond}), Quota: q, Now: clock.Now}
		if opts.deps != nil {
			opts.deps(&d)
		}
		return d
	}
	if opts.config != nil {
		opts.config(&cfg)
	}
	e.cfg = cfg
	e.svc = e.replica(t)
	return e
}

// replica starts another Service on the same runtime and Redis: a second replica.
func (e *env) replica(t *testing.T) *Service {
	t.Helper()
	svc, err := New(e.cfg, e.newDeps())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

func ptr[T any](v T) *T { return &v }

func mustExec(t *testing.T, e *env, p auth.Principal, id string, argv ...string) ExecResult {
	t.Helper()
	res, err := e.svc.Exec(context.Background(), p, id, ExecRequest{Command: argv, TimeoutSec: ptr[int64](30)})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return res
}

func TestLifecycleRestoresALostWorkspace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != Running || sb.Profile != "p" || sb.AutostopSec != 1800 {
		t.Fatalf("create: got %+v", sb)
	}
	// A venv-like absolute link out of the workspace must survive a restore too.
	mustExec(t, e, alice, sb.ID, "sh", "-c", "mkdir -p d && echo kept > d/f && ln -s d/f link && ln -s /usr/bin/env abs")
	if res := mustExec(t, e, alice, sb.ID, "cat", "link"); string(res.Stdout) != "kept\n" {
		t.Fatalf("second exec: got %q, want %q", res.Stdout, "kept\n")
	}
	stopped, err := e.svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stopped.State != Stopped || stopped.LatestSnapshotID == "" {
		t.Fatalf("stop: got state %s snapshot %q, want STOPPED with a snapshot", stopped.State, stopped.LatestSnapshotID)
	}
	// The runtime loses the workspace (a node and its volume gone): start restores the checkpoint.
	if err := os.RemoveAll(e.fake.Workspace(sb.ID)); err != nil {
		t.Fatal(err)
	}
	started, err := e.svc.Start(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if started.State != Running {
		t.Fatalf("start: got %s, want RUNNING", started.State)
	}
	if res := mustExec(t, e, alice, sb.ID, "cat", "link"); string(res.Stdout) != "kept\n" {
		t.Fatalf("after restore: got %q, want %q", res.Stdout, "kept\n")
	}
	if res := mustExec(t, e, alice, sb.ID, "readlink", "abs"); string(res.Stdout) != "/usr/bin/env\n" {
		t.Fatalf("absolute link after restore: got %q, want %q", res.Stdout, "/usr/bin/env\n")
	}
	res, err := e.svc.Destroy(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotID == "" || res.SnapshotID == stopped.LatestSnapshotID {
		t.Fatalf("destroy: got snapshot %q, want a new final one (previous %q)", res.SnapshotID, stopped.LatestSnapshotID)
	}
	if _, err := e.svc.Get(ctx, alice, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("get after destroy: got %v, want NOT_FOUND", err)
	}
	// The final snapshot holds the workspace.
	r, _, err := e.ckpt.Open(ctx, checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}, res.SnapshotID)
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
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, e, alice, sb.ID, "sh", "-c", "echo kept > early")
	good, err := e.svc.Snapshot(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, e, alice, sb.ID, "sh", "-c", "head -c 300000 /dev/urandom > blob")
	stopped, err := e.svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	corruptCheckpointData(t, e, checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}, stopped.LatestSnapshotID)
	if err := os.RemoveAll(e.fake.Workspace(sb.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Start(ctx, alice, sb.ID)
	ae := apierror.From(err)
	if err == nil || ae.Code != apierror.CheckpointCorrupt || !strings.Contains(ae.Message, stopped.LatestSnapshotID) ||
		!strings.Contains(ae.Message, "last good snapshot is "+good.ID) || ae.Details["last_good_snapshot_id"] != good.ID {
		t.Fatalf("start from a corrupt checkpoint: got %v (%+v), want CHECKPOINT_CORRUPT naming %s and the last good snapshot %s",
			err, ae.Details, stopped.LatestSnapshotID, good.ID)
	}
	got, _ := e.svc.Get(ctx, alice, sb.ID)
	if got.State != Failed || !strings.Contains(got.StateReason, "corrupt") {
		t.Fatalf("got %s %q, want FAILED saying the checkpoint is corrupt", got.State, got.StateReason)
	}
	if _, err := os.Stat(filepath.Join(e.fake.Workspace(sb.ID), "blob")); err == nil {
		t.Fatal("the corrupt checkpoint's blob was extracted into the workspace")
	}
}

// corruptCheckpointData flips a byte in the middle of a checkpoint's data object, so that its
// hash no longer matches its manifest.
func corruptCheckpointData(t *testing.T, e *env, sc checkpoint.Scope, snapID string) {
	t.Helper()
	m, err := e.ckpt.Get(context.Background(), sc, snapID)
	if err != nil {
		t.Fatal(err)
	}
	path, err := e.objs.Path(m.Object)
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
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"get": func() error { _, err := e.svc.Get(ctx, bob, sb.ID); return err },
		"exec": func() error {
			_, err := e.svc.Exec(ctx, bob, sb.ID, ExecRequest{Command: []string{"true"}})
			return err
		},
		"stop":    func() error { _, err := e.svc.Stop(ctx, bob, sb.ID); return err },
		"start":   func() error { _, err := e.svc.Start(ctx, bob, sb.ID); return err },
		"destroy": func() error { _, err := e.svc.Destroy(ctx, bob, sb.ID); return err },
		"read":    func() error { _, _, err := e.svc.ReadFile(ctx, bob, sb.ID, "f", 10); return err },
		"write": func() error {
			_, err := e.svc.WriteFile(ctx, bob, sb.ID, "f", 0, strings.NewReader("x"))
			return err
		},
		"list":   func() error { _, _, err := e.svc.ListDir(ctx, bob, sb.ID, ".", 10); return err },
		"events": func() error { _, err := e.svc.Events(ctx, bob, sb.ID, ""); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); apierror.CodeOf(err) != apierror.NotFound {
				t.Fatalf("got %v, want NOT_FOUND", err)
			}
		})
	}
	page, err := e.svc.List(ctx, bob, ListOptions{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Fatalf("bob's list: got %d sandboxes, %v, want none", len(page.Sandboxes), err)
	}
	if got, _ := e.svc.Get(ctx, alice, sb.ID); got.State != Running {
		t.Fatalf("alice's sandbox after bob's attempts: got %s, want RUNNING", got.State)
	}
}

func TestConcurrentStopsOneWins(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.svc.Stop(ctx, alice, sb.ID)
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
	got, _ := e.svc.Get(ctx, alice, sb.ID)
	if got.State != Stopped {
		t.Fatalf("got %s, want STOPPED", got.State)
	}
}

func TestCrashedBoxIsFailed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, e, alice, sb.ID, "true")
	if err := e.fake.Kill(sb.ID, "out of memory"); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"true"}})
	if c := apierror.CodeOf(err); c != apierror.SandboxFailed && c != apierror.InvalidState {
		t.Fatalf("exec on a crashed box: got %v, want SANDBOX_FAILED or INVALID_STATE", err)
	}
	got, err := e.svc.Get(ctx, alice, sb.ID)
	if err != nil || got.State != Failed || !strings.Contains(got.StateReason, "out of memory") {
		t.Fatalf("got %s %q %v, want FAILED with the reason", got.State, got.StateReason, err)
	}
	// A failed sandbox can be started again on its workspace.
	if got, err := e.svc.Start(ctx, alice, sb.ID); err != nil || got.State != Running {
		t.Fatalf("start after failure: got %v %v, want RUNNING", got.State, err)
	}
	mustExec(t, e, alice, sb.ID, "true")
}

// TestLostBoxIsStartedAgain: a box whose compute was taken away (a pod deleted behind the
// control plane's back) is reported FAILED with the reason and started again on its kept
// workspace; on a full project it stays FAILED for a caller to start later.
func TestLostBoxIsStartedAgain(t *testing.T) {
	e := newEnvWithLimit(t, 1)
	ctx := context.Background()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, e, alice, sb.ID, "sh", "-c", "echo kept > f")
	if err := e.fake.Lose(sb.ID, "the sandbox's pod is gone"); err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Get(ctx, alice, sb.ID)
	if err != nil || (got.State != Failed && got.State != Starting && got.State != Running) {
		t.Fatalf("right after the loss: got %s %v", got.State, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.State != Running && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got, _ = e.svc.Get(ctx, alice, sb.ID)
	}
	if got.State != Running {
		t.Fatalf("got %s (%q), want RUNNING again", got.State, got.StateReason)
	}
	if res := mustExec(t, e, alice, sb.ID, "cat", "f"); string(res.Stdout) != "kept\n" {
		t.Errorf("after the recovery read %q, want the workspace kept", res.Stdout)
	}
	if u := usage(t, e); u.InUse != 1 {
		t.Errorf("after the recovery %d slots in use, want 1", u.InUse)
	}

	// The project's one slot taken meanwhile: the lost box stays FAILED, with the reason.
	if err := e.fake.Lose(sb.ID, "the sandbox's pod is gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Get(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	other, otherErr := e.svc.Create(ctx, alice, CreateRequest{})
	e.svc.recovering.Wait()
	got, _ = e.svc.Get(ctx, alice, sb.ID)
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
	e := newEnv(t)
	ctx := context.Background()
	e.fake.FailNext("Create", errors.New("boom"))
	if _, err := e.svc.Create(ctx, alice, CreateRequest{}); apierror.CodeOf(err) != apierror.Unavailable {
		t.Fatalf("got %v, want UNAVAILABLE", err)
	}
	boxes, _ := e.fake.List(ctx)
	page, _ := e.svc.List(ctx, alice, ListOptions{})
	if len(boxes) != 0 || len(page.Sandboxes) != 0 {
		t.Fatalf("after a failed create: %d boxes, %d listed, want none", len(boxes), len(page.Sandboxes))
	}
}

func TestEventsFollowTransitions(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sb, err := e.svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.svc.Events(ctx, alice, sb.ID, "0-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Destroy(ctx, alice, sb.ID); err != nil {
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
	e := newEnv(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		sb, err := e.svc.Create(ctx, alice, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if _, err := e.svc.Stop(ctx, alice, ids[1]); err != nil {
		t.Fatal(err)
	}
	var seen []string
	cursor := ""
	for i := 0; i < 10; i++ {
		page, err := e.svc.List(ctx, alice, ListOptions{Limit: 2, After: cursor})
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
	page, err := e.svc.List(ctx, alice, ListOptions{State: Stopped})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != ids[1] {
		t.Fatalf("state filter: got %+v %v, want only %s", page.Sandboxes, err, ids[1])
	}
	if _, err := e.svc.List(ctx, alice, ListOptions{Limit: 100000}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("huge page: got %v, want INVALID_ARGUMENT", err)
	}
}
