package sandbox_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/runtime"
)

func snapshotIDs(ss []SnapshotInfo) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func mustSnapshot(t *testing.T, e *domaintest.Env, id string) SnapshotInfo {
	t.Helper()
	snap, err := e.Svc.Snapshot(context.Background(), alice, id)
	if err != nil {
		t.Fatalf("snapshot %s: %v", id, err)
	}
	return snap
}

func TestSnapshotWhileRunning(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo one > a")
	first := mustSnapshot(t, e, sb.ID)
	if _, _, err := checkpoint.ParseID(first.ID); err != nil || first.SandboxID != sb.ID || first.Parent != "" ||
		first.SizeBytes <= 0 || first.RawSizeBytes <= 0 || len(first.SHA256) != 64 || first.CreatedAt.IsZero() {
		t.Fatalf("first snapshot: got %+v, want a snapshot of %s without a parent", first, sb.ID)
	}
	// The sandbox keeps running and working; the snapshot is its latest.
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || got.State != Running || got.LatestSnapshotID != first.ID {
		t.Fatalf("after snapshot: got %s latest %q %v, want RUNNING with latest %s", got.State, got.LatestSnapshotID, err, first.ID)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo two > b")
	if res := e.MustExec(t, alice, sb.ID, "cat", "a", "b"); string(res.Stdout) != "one\ntwo\n" {
		t.Fatalf("exec after snapshot: got %q, want %q", res.Stdout, "one\ntwo\n")
	}
	second := mustSnapshot(t, e, sb.ID)
	if second.Parent != first.ID {
		t.Fatalf("second snapshot: got parent %q, want %s", second.Parent, first.ID)
	}
	list, err := e.Svc.ListSnapshots(ctx, alice, sb.ID, 0)
	if got, want := strings.Join(snapshotIDs(list), ","), second.ID+","+first.ID; err != nil || got != want {
		t.Fatalf("list: got %s %v, want %s (newest first)", got, err, want)
	}
	if one, err := e.Svc.GetSnapshot(ctx, alice, first.ID); err != nil || one != first {
		t.Fatalf("get: got %+v %v, want %+v", one, err, first)
	}
	// The project's list holds every sandbox's snapshots, newest first, up to the limit.
	other, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	third := mustSnapshot(t, e, other.ID)
	all, err := e.Svc.ListSnapshots(ctx, alice, "", 0)
	if got, want := strings.Join(snapshotIDs(all), ","), third.ID+","+second.ID+","+first.ID; err != nil || got != want {
		t.Fatalf("project list: got %s %v, want %s", got, err, want)
	}
	if page, err := e.Svc.ListSnapshots(ctx, alice, "", 2); err != nil || len(page) != 2 || page[0].ID != third.ID {
		t.Fatalf("project list, limit 2: got %v %v, want the two newest", snapshotIDs(page), err)
	}
	if _, err := e.Svc.ListSnapshots(ctx, alice, "", 100000); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("huge page: got %v, want INVALID_ARGUMENT", err)
	}
	// Stop takes the next one, with the running one as its parent.
	stopped, err := e.Svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := e.Svc.GetSnapshot(ctx, alice, stopped.LatestSnapshotID); err != nil || m.Parent != second.ID {
		t.Fatalf("stop's snapshot: got %+v %v, want parent %s", m, err, second.ID)
	}
}

func TestSnapshotRefusedOutsideRunning(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Another operation holds the lock: busy, with a retry-after.
	lock, err := e.Store.Lock(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Svc.Snapshot(ctx, alice, sb.ID)
	lock.Unlock(ctx)
	if ae := apierror.From(err); ae.Code != apierror.InvalidState || ae.RetryAfter <= 0 {
		t.Fatalf("snapshot under a held lock: got %v, want INVALID_STATE with retry-after", err)
	}
	if _, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.Svc.Snapshot(ctx, alice, sb.ID)
	if ae := apierror.From(err); ae.Code != apierror.InvalidState || ae.Details["state"] != string(Stopped) {
		t.Fatalf("snapshot of a stopped sandbox: got %v, want INVALID_STATE with state STOPPED", err)
	}
}

func TestDeleteSnapshot(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first := mustSnapshot(t, e, sb.ID)
	second := mustSnapshot(t, e, sb.ID)
	third := mustSnapshot(t, e, sb.ID)
	if err := e.Svc.DeleteSnapshot(ctx, alice, first.ID); err != nil {
		t.Fatalf("delete an older snapshot: %v", err)
	}
	if _, err := e.Svc.GetSnapshot(ctx, alice, first.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("get after delete: got %v, want NOT_FOUND", err)
	}
	if err := e.Svc.DeleteSnapshot(ctx, alice, first.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("second delete: got %v, want NOT_FOUND", err)
	}
	// A running sandbox's latest may go: the newest one left becomes its latest.
	if err := e.Svc.DeleteSnapshot(ctx, alice, third.ID); err != nil {
		t.Fatalf("delete the latest of a running sandbox: %v", err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.LatestSnapshotID != second.ID {
		t.Fatalf("latest after deleting it: got %q, want %s", got.LatestSnapshotID, second.ID)
	}
	// A stopped sandbox's latest is the only copy of its workspace.
	stopped, err := e.Svc.Stop(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	err = e.Svc.DeleteSnapshot(ctx, alice, stopped.LatestSnapshotID)
	if ae := apierror.From(err); ae.Code != apierror.InvalidState || !strings.Contains(ae.Message, "only copy") ||
		!strings.Contains(ae.Message, stopped.LatestSnapshotID) {
		t.Fatalf("delete a stopped sandbox's latest: got %v, want INVALID_STATE naming it the only copy", err)
	}
	if err := e.Svc.DeleteSnapshot(ctx, alice, second.ID); err != nil {
		t.Fatalf("delete a stopped sandbox's older snapshot: %v", err)
	}
	// Once the sandbox is destroyed, its snapshots stay listed and can all be deleted.
	res, err := e.Svc.Destroy(ctx, alice, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotID != stopped.LatestSnapshotID {
		t.Fatalf("destroy of a stopped sandbox: got snapshot %q, want its latest %s", res.SnapshotID, stopped.LatestSnapshotID)
	}
	list, err := e.Svc.ListSnapshots(ctx, alice, sb.ID, 0)
	if err != nil || len(list) != 1 || list[0].ID != res.SnapshotID {
		t.Fatalf("list of a destroyed sandbox: got %v %v, want [%s]", snapshotIDs(list), err, res.SnapshotID)
	}
	if err := e.Svc.DeleteSnapshot(ctx, alice, res.SnapshotID); err != nil {
		t.Fatalf("delete a destroyed sandbox's last snapshot: %v", err)
	}
	if _, err := e.Svc.ListSnapshots(ctx, alice, sb.ID, 0); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("list of a destroyed sandbox without snapshots: got %v, want NOT_FOUND", err)
	}
}

func TestSnapshotRetention(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	e.Config.KeepCheckpoints = 3
	e.Svc = e.Replica(t)
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var all []SnapshotInfo
	for range 5 {
		all = append(all, mustSnapshot(t, e, sb.ID))
	}
	list, err := e.Svc.ListSnapshots(ctx, alice, sb.ID, 0)
	if got, want := strings.Join(snapshotIDs(list), ","), all[4].ID+","+all[3].ID+","+all[2].ID; err != nil || got != want {
		t.Fatalf("after 5 snapshots keeping 3: got %s %v, want %s", got, err, want)
	}
	// The recorded latest is never deleted, even when newer checkpoints push it out.
	rec, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	sc := ScopeOf(rec.Record)
	for range 3 {
		if _, err := e.Ckpt.Save(ctx, sc, strings.NewReader(""), ""); err != nil {
			t.Fatal(err)
		}
	}
	Retain(ctx, e.Svc.Core, rec.Record, all[4].ID)
	list, err = e.Svc.ListSnapshots(ctx, alice, sb.ID, 0)
	if err != nil || len(list) != 4 || list[3].ID != all[4].ID {
		t.Fatalf("retention with an older latest: got %v %v, want the 3 newest and the latest %s", snapshotIDs(list), err, all[4].ID)
	}
}

func TestSnapshotTenancy(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap := mustSnapshot(t, e, sb.ID)
	calls := map[string]func() error{
		"snapshot": func() error { _, err := e.Svc.Snapshot(ctx, bob, sb.ID); return err },
		"get":      func() error { _, err := e.Svc.GetSnapshot(ctx, bob, snap.ID); return err },
		"delete":   func() error { return e.Svc.DeleteSnapshot(ctx, bob, snap.ID) },
		"list":     func() error { _, err := e.Svc.ListSnapshots(ctx, bob, sb.ID, 0); return err },
		"create-from": func() error {
			_, err := e.Svc.Create(ctx, bob, CreateRequest{Source: &Source{SnapshotID: snap.ID}})
			return err
		},
		"malformed-id": func() error { _, err := e.Svc.GetSnapshot(ctx, alice, "snap_../../x"); return err },
		"missing-id": func() error {
			_, err := e.Svc.GetSnapshot(ctx, alice, strings.Replace(snap.ID, "_0000000001", "_0000000009", 1))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); apierror.CodeOf(err) != apierror.NotFound {
				t.Fatalf("got %v, want NOT_FOUND", err)
			}
		})
	}
	if list, err := e.Svc.ListSnapshots(ctx, bob, "", 0); err != nil || len(list) != 0 {
		t.Fatalf("bob's project list: got %v %v, want none", snapshotIDs(list), err)
	}
	if _, err := e.Svc.GetSnapshot(ctx, alice, snap.ID); err != nil {
		t.Fatalf("alice's snapshot after bob's attempts: %v", err)
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 1 {
		t.Fatalf("got %d boxes, want only alice's (bob's create from her snapshot made none)", len(boxes))
	}
}

func TestCreateFromSnapshot(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c",
		"mkdir -p src && echo kept > src/f && chmod 0750 src/f && ln -s src/f link && ln -s /usr/bin/env abs")
	snap := mustSnapshot(t, e, sb.ID)
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo later > later")
	if _, err := e.Svc.Destroy(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{SnapshotID: snap.ID}})
	if err != nil {
		t.Fatalf("create from %s: %v", snap.ID, err)
	}
	if got.State != Running || got.ID == sb.ID {
		t.Fatalf("create from a snapshot: got %s %s, want a new RUNNING sandbox", got.ID, got.State)
	}
	if res := e.MustExec(t, alice, got.ID, "cat", "link"); string(res.Stdout) != "kept\n" {
		t.Fatalf("restored file through its link: got %q, want %q", res.Stdout, "kept\n")
	}
	if res := e.MustExec(t, alice, got.ID, "readlink", "abs"); string(res.Stdout) != "/usr/bin/env\n" {
		t.Fatalf("restored absolute link: got %q, want %q", res.Stdout, "/usr/bin/env\n")
	}
	if res := e.MustExec(t, alice, got.ID, "stat", "-c", "%a", "src/f"); string(res.Stdout) != "750\n" {
		t.Fatalf("restored mode: got %q, want 750", res.Stdout)
	}
	if _, err := os.Lstat(e.Fake.Workspace(got.ID) + "/later"); !os.IsNotExist(err) {
		t.Fatalf("a file written after the snapshot: got %v, want it absent", err)
	}
	// The new sandbox's first snapshot descends from its source.
	first := mustSnapshot(t, e, got.ID)
	if first.Parent != snap.ID || first.SandboxID != got.ID {
		t.Fatalf("first snapshot of the new sandbox: got %+v, want parent %s", first, snap.ID)
	}
}

func TestCreateSourceArguments(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	tests := []struct {
		name    string
		src     Source
		code    apierror.Code
		mention string
	}{
		{name: "empty", src: Source{}, code: apierror.InvalidArgument, mention: "exactly one"},
		{name: "two", src: Source{SnapshotID: "snap_x", ArchiveURL: "https://x/a.zip"}, code: apierror.InvalidArgument, mention: "exactly one"},
		// The archive and GCS refusals: TestCreateSourceArgumentsRefused (bootstrap_test.go).
		{name: "malformed-snapshot", src: Source{SnapshotID: "snap_nope"}, code: apierror.NotFound, mention: "snap_nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &tt.src})
			if ae := apierror.From(err); ae.Code != tt.code || !strings.Contains(ae.Message, tt.mention) {
				t.Fatalf("got %v, want %s mentioning %q", err, tt.code, tt.mention)
			}
		})
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 0 {
		t.Fatalf("got %d boxes after refused creates, want none", len(boxes))
	}
}

func TestCreateFromCorruptSnapshot(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 1})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "head -c 300000 /dev/urandom > blob")
	snap := mustSnapshot(t, e, sb.ID)
	if _, err := e.Svc.Destroy(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	corruptCheckpointData(t, e, checkpoint.Scope{Tenant: alice.Tenant, Project: alice.Project, Sandbox: sb.ID}, snap.ID)
	_, err = e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{SnapshotID: snap.ID}})
	if msg := apierror.From(err).Message; err == nil || !strings.Contains(msg, snap.ID) || !strings.Contains(msg, "corrupt") {
		t.Fatalf("create from a corrupt snapshot: got %v, want an error naming %s as corrupt", err, snap.ID)
	}
	// Nothing is left, and the slot is back: the project's one slot takes a new sandbox.
	boxes, _ := e.Fake.List(ctx)
	page, _ := e.Svc.List(ctx, alice, ListOptions{})
	if len(boxes) != 0 || len(page.Sandboxes) != 0 {
		t.Fatalf("after a failed create: %d boxes, %d listed, want none", len(boxes), len(page.Sandboxes))
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("after a failed create: got %d slots in use, want 0", u.InUse)
	}
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); err != nil {
		t.Fatalf("create after the failed one: %v", err)
	}
}

// A create from a snapshot whose replica died before RUNNING is finished by the reconciler,
// which restores the source first.
func TestReconcilerFinishesACreateFromSnapshot(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > f")
	snap := mustSnapshot(t, e, sb.ID)
	// A record left CREATING with its source, the box up with an empty workspace.
	now := e.Clock.Now().UTC()
	rec := runtime.Record{ID: NewID("sbx_"), Tenant: alice.Tenant, Project: alice.Project, Spec: runtime.BoxSpec{Profile: "p"},
		State: string(Creating), DesiredState: string(Running), CreatedAt: now, StateChangedAt: now,
		Annotations: map[string]string{AnnSourceSnapshot: snap.ID}}
	if err := e.Store.Put(ctx, EntryOf(runtime.Box{Record: rec})); err != nil {
		t.Fatal(err)
	}
	if err := e.Fake.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.Svc.Get(ctx, alice, rec.ID)
	if err != nil || got.State != Running {
		t.Fatalf("got %s %q %v, want RUNNING", got.State, got.StateReason, err)
	}
	if res := e.MustExec(t, alice, rec.ID, "cat", "f"); string(res.Stdout) != "kept\n" {
		t.Fatalf("restored by the reconciler: got %q, want %q", res.Stdout, "kept\n")
	}
}

// TestCreateFromSnapshotLargerThanDisk: a snapshot holding more than the new sandbox's disk is
// refused with INVALID_ARGUMENT naming both sizes, and the refused create leaves nothing.
func TestCreateFromSnapshotLargerThanDisk(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Config: func(c *Config) {
		c.Profiles = append(c.Profiles, ProfileConfig{Name: "small", MemoryMB: 64, DiskMB: 1})
	}})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "head -c 2000000 /dev/zero > big")
	snap := mustSnapshot(t, e, sb.ID)

	// Before a slot is taken (what Create calls first) …
	if err := CreateSource(ctx, e.Svc.Core, alice, &Source{SnapshotID: snap.ID}, 1<<20); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("createSource: got %v, want INVALID_ARGUMENT", err)
	}
	if err := CreateSource(ctx, e.Svc.Core, alice, &Source{SnapshotID: snap.ID}, 0); err != nil {
		t.Fatalf("createSource on the default disk: got %v, want nil", err)
	}
	// … and whatever path the create takes.
	_, err = e.Svc.Create(ctx, alice, CreateRequest{Profile: "small", Source: &Source{SnapshotID: snap.ID}})
	ae := apierror.From(err)
	if ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, "more than the sandbox's disk (disk_mb 1)") ||
		!strings.Contains(ae.Message, snap.ID) {
		t.Fatalf("create from a snapshot larger than the disk: got %v, want INVALID_ARGUMENT naming the snapshot and disk_mb 1", err)
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 1 {
		t.Errorf("boxes after the refused create: got %d, want only the source sandbox", len(boxes))
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Errorf("slots after the refused create: got %d, want 1 (the source sandbox's)", u.InUse)
	}
	// The same snapshot fits a sandbox of the default profile.
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{SnapshotID: snap.ID}}); err != nil {
		t.Fatalf("create from the snapshot on a large enough disk: %v", err)
	}
}
