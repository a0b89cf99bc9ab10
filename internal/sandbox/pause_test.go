package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/runtime"
	"sandboxd/runtime/runtimetest"
)

// A background loop of the fake's host shell: it appends a line to a file of the workspace
// every 20 ms (the fake does not freeze a paused box's commands, so it goes on while PAUSED).
const appendLoop = `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo $i >> counter; sleep 0.02; done`

func detached(t *testing.T, e *domaintest.Env, id string, argv ...string) ExecResult {
	t.Helper()
	res, err := e.Svc.Exec(context.Background(), alice, id, ExecRequest{Command: argv, Detach: true})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return res
}

func TestPauseAndResume(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 1})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > file")
	loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)

	paused, err := e.Svc.Pause(ctx, alice, sb.ID)
	if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if paused.State != Paused || paused.LatestSnapshotID == "" || paused.StateReason != "" {
		t.Fatalf("pause: got %s %q snapshot %q, want PAUSED with a snapshot", paused.State, paused.StateReason, paused.LatestSnapshotID)
	}
	// A paused sandbox holds no slot: the project's one slot is free for another sandbox.
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("quota in use while PAUSED: got %d, want 0", u.InUse)
	}
	// Its memory image is stored beside the checkpoints, in the same object store, after the
	// answer.
	mem := e.Ckpt.Derive(MemoryPrefix)
	waitImages(t, mem, sb.ID, 1)
	for name, call := range map[string]func() error{
		"exec": func() error {
			_, err := e.Svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"true"}})
			return err
		},
		"files": func() error { _, _, err := e.Svc.ReadFile(ctx, alice, sb.ID, "file", 100); return err },
		"pause": func() error { _, err := e.Svc.Pause(ctx, alice, sb.ID); return err },
		"start": func() error { _, err := e.Svc.Start(ctx, alice, sb.ID); return err },
	} {
		ae := apierror.From(call())
		if ae.Code != apierror.InvalidState || ae.Details["state"] != "PAUSED" || ae.RetryAfter != 0 {
			t.Errorf("%s on a PAUSED sandbox: got %v (%+v), want INVALID_STATE naming PAUSED", name, ae, ae.Details)
		}
		if name == "exec" && !strings.Contains(ae.Message, "resume it first") {
			t.Errorf("exec on a PAUSED sandbox: got %q, want a hint to resume it", ae.Message)
		}
	}
	// Another tenant's ids do not exist.
	if _, err := e.Svc.Resume(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("bob resumes alice's sandbox: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.Pause(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("bob pauses alice's sandbox: got %v, want NOT_FOUND", err)
	}

	// Resume takes a slot: with the project's one slot taken, it is 429 with Retry-After.
	other := e.CreateRunning(t, alice)
	_, err = e.Svc.Resume(ctx, alice, sb.ID)
	if ae := apierror.From(err); ae.Code != apierror.QuotaExceeded || ae.RetryAfter <= 0 {
		t.Fatalf("resume with the project full: got %v, want QUOTA_EXCEEDED with Retry-After", err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Paused {
		t.Fatalf("after a refused resume: got %s, want PAUSED", got.State)
	}
	if _, err := e.Svc.Destroy(ctx, alice, other.ID); err != nil {
		t.Fatal(err)
	}
	resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if resumed.State != Running || resumed.StateReason != "" {
		t.Fatalf("resume: got %s %q, want RUNNING without a reason", resumed.State, resumed.StateReason)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Fatalf("quota in use after resume: got %d, want 1", u.InUse)
	}
	// The command that ran across the pause still runs: it is the same process.
	st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false)
	if err != nil || st.State != ExecRunning {
		t.Fatalf("the loop after resume: got %+v, %v, want RUNNING", st, err)
	}
	if res := e.MustExec(t, alice, sb.ID, "cat", "file"); string(res.Stdout) != "kept\n" {
		t.Fatalf("workspace after resume: %q", res.Stdout)
	}
	// The stored image is deleted (in the background) once the sandbox runs.
	waitNoImages(t, mem, sb.ID)
	if _, err := e.Svc.Resume(ctx, alice, sb.ID); apierror.CodeOf(err) != apierror.InvalidState {
		t.Fatalf("resume of a RUNNING sandbox: got %v, want INVALID_STATE", err)
	}
}

func TestResumeWithoutMemoryStartsOnTheWorkspace(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, e *domaintest.Env, sb Sandbox)
		want []string
	}{
		{"Lost", func(t *testing.T, e *domaintest.Env, sb Sandbox) {
			// Another host, a runsc upgrade: the image cannot bring the processes back.
			if err := e.Fake.LoseMemory(sb.ID); err != nil {
				t.Fatal(err)
			}
		}, []string{"memory not restored", "processes are gone"}},
		{"Corrupt", func(t *testing.T, e *domaintest.Env, sb Sandbox) {
			// The runtime's own copy is gone (a new host folder), the stored one corrupt.
			dropKept(t, e, sb.ID)
			corruptMemory(t, e, sb.ID)
		}, []string{"memory not restored", "CHECKPOINT_CORRUPT", "corrupt"}},
		{"Deleted", func(t *testing.T, e *domaintest.Env, sb Sandbox) {
			dropKept(t, e, sb.ID)
			mem := e.Ckpt.Derive(MemoryPrefix)
			sc := checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}
			list, _ := mem.List(context.Background(), sc)
			for _, m := range list {
				if err := mem.Delete(context.Background(), sc, m.ID); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"memory not restored", "is gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := domaintest.New(t, domaintest.Options{})
			ctx := context.Background()
			sb := e.CreateRunning(t, alice)
			e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > file")
			loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)
			if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
			waitStored(t, e, sb.ID)
			tc.lose(t, e, sb)
			resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
			if err != nil {
				t.Fatalf("Resume: %v", err)
			}
			if resumed.State != Running {
				t.Fatalf("got %s, want RUNNING", resumed.State)
			}
			for _, w := range tc.want {
				if !strings.Contains(resumed.StateReason, w) {
					t.Fatalf("state_reason %q, want it to say %q", resumed.StateReason, w)
				}
			}
			if res := e.MustExec(t, alice, sb.ID, "cat", "file"); string(res.Stdout) != "kept\n" {
				t.Fatalf("workspace after the fallback: %q", res.Stdout)
			}
			// The command did not survive: its exec ends, saying why.
			deadline := time.Now().Add(20 * time.Second)
			for {
				st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false)
				if err == nil && st.State != ExecRunning {
					if !strings.Contains(st.Error, "restarted") {
						t.Fatalf("the loop's end: %+v, want it to say the sandbox restarted", st)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the loop's exec did not end after a resume without memory: %+v, %v", st, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			waitNoImages(t, e.Ckpt.Derive(MemoryPrefix), sb.ID)
		})
	}
}

// waitNoImages waits until alice's sandbox id has no stored memory image.
func waitNoImages(t *testing.T, mem *checkpoint.Store, id string) {
	t.Helper()
	waitImages(t, mem, id, 0)
}

// waitStored waits until alice's paused sandbox id has its memory image stored and recorded
// (the store is done: its manifest appears a moment before the record names it).
func waitStored(t *testing.T, e *domaintest.Env, id string) {
	t.Helper()
	waitImages(t, e.Ckpt.Derive(MemoryPrefix), id, 1)
	waitNoStores(t, e)
}

// waitNoStores waits until the replica runs no memory image store.
func waitNoStores(t *testing.T, e *domaintest.Env) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for MemoryStores(e.Svc.Core) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the memory image store did not end")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitImages waits until alice's sandbox id has n stored memory images (a pause's image is
// stored after its answer).
func waitImages(t *testing.T, mem *checkpoint.Store, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := mem.List(context.Background(), checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: id})
		if err == nil && len(list) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored memory images of %s: %d (%v), want %d", id, len(list), err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dropKept deletes the runtime's own copy of a paused sandbox's memory image.
func dropKept(t *testing.T, e *domaintest.Env, id string) {
	t.Helper()
	if err := e.Fake.DropMemoryImage(context.Background(), id); err != nil {
		t.Fatal(err)
	}
}

func TestResumeFromTheKeptOrTheStoredImage(t *testing.T) {
	for _, tc := range []struct {
		name string
		harm func(t *testing.T, e *domaintest.Env, id string)
	}{
		// The runtime's copy is used first: a corrupt stored copy is not read.
		{"KeptCopy", func(t *testing.T, e *domaintest.Env, id string) { corruptMemory(t, e, id) }},
		// Without the runtime's copy, the stored one brings the processes back.
		{"StoredCopy", func(t *testing.T, e *domaintest.Env, id string) { dropKept(t, e, id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := domaintest.New(t, domaintest.Options{})
			ctx := context.Background()
			sb := e.CreateRunning(t, alice)
			loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)
			if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
			waitStored(t, e, sb.ID)
			tc.harm(t, e, sb.ID)
			resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
			if err != nil || resumed.State != Running || resumed.StateReason != "" {
				t.Fatalf("resume: %+v, %v, want RUNNING with its memory", resumed, err)
			}
			if st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false); err != nil || st.State != ExecRunning {
				t.Fatalf("the loop after resume: %+v, %v, want RUNNING", st, err)
			}
		})
	}
}

// corruptMemory flips a byte in the middle of the sandbox's stored memory image.
func corruptMemory(t *testing.T, e *domaintest.Env, id string) {
	t.Helper()
	mem := e.Ckpt.Derive(MemoryPrefix)
	list, err := mem.List(context.Background(), checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: id})
	if err != nil || len(list) != 1 {
		t.Fatalf("memory images: %d, %v", len(list), err)
	}
	path, err := e.Objs.Path(list[0].Object)
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

func TestPauseUnsupportedOrRefused(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 2})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	e.Fake.FailNext("Pause", fmt.Errorf("kube: no: %w", runtime.ErrUnsupported))
	_, err := e.Svc.Pause(ctx, alice, sb.ID)
	if ae := apierror.From(err); ae.Code != apierror.Unsupported || ae.Code.HTTPStatus() != 501 {
		t.Fatalf("pause on a runtime that cannot: got %v (status %d), want UNSUPPORTED 501", err, ae.Code.HTTPStatus())
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Running {
		t.Fatalf("after an unsupported pause: got %s, want RUNNING", got.State)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Fatalf("quota after an unsupported pause: %d, want 1", u.InUse)
	}
	e.MustExec(t, alice, sb.ID, "true")
}

func TestStopAndDestroyOfAPausedSandbox(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	mem := e.Ckpt.Derive(MemoryPrefix)
	for _, verb := range []string{"stop", "destroy"} {
		t.Run(verb, func(t *testing.T) {
			sb := e.CreateRunning(t, alice)
			e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > file")
			paused, err := e.Svc.Pause(ctx, alice, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			sc := checkpoint.Scope{Tenant: "t1", Project: "p1", Sandbox: sb.ID}
			if verb == "stop" {
				stopped, err := e.Svc.Stop(ctx, alice, sb.ID)
				if err != nil || stopped.State != Stopped || stopped.LatestSnapshotID != paused.LatestSnapshotID {
					t.Fatalf("stop of a PAUSED sandbox: got %+v, %v, want STOPPED with the pause's snapshot", stopped, err)
				}
				if _, err := e.Svc.Start(ctx, alice, sb.ID); err != nil {
					t.Fatal(err)
				}
				if res := e.MustExec(t, alice, sb.ID, "cat", "file"); string(res.Stdout) != "kept\n" {
					t.Fatalf("workspace after stop and start: %q", res.Stdout)
				}
			} else {
				res, err := e.Svc.Destroy(ctx, alice, sb.ID)
				if err != nil || res.SnapshotID != paused.LatestSnapshotID {
					t.Fatalf("destroy of a PAUSED sandbox: got %+v, %v, want the pause's snapshot", res, err)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				list, _ := mem.List(ctx, sc)
				if len(list) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("memory images after %s: %d, want 0", verb, len(list))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if verb == "stop" {
				if _, err := e.Fake.MemoryImage(ctx, sb.ID); err == nil {
					t.Fatal("the runtime still keeps the memory image of a stopped sandbox")
				}
			}
		})
	}
}

func TestAutoResume(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{AutoResume: true, AutostopAction: AutostopPause})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.AutoResume || sb.AutostopAction != AutostopPause {
		t.Fatalf("create: got auto_resume %v autostop_action %q", sb.AutoResume, sb.AutostopAction)
	}
	e.MustExec(t, alice, sb.ID, "sh", "-c", "echo kept > file")
	if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	// An exec and a file call each resume the sandbox first.
	if res := e.MustExec(t, alice, sb.ID, "cat", "file"); string(res.Stdout) != "kept\n" {
		t.Fatalf("exec on an auto-resume sandbox: %q", res.Stdout)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Running || got.StateReason != "" {
		t.Fatalf("after the exec: got %s %q, want RUNNING", got.State, got.StateReason)
	}
	if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if b, _, err := e.Svc.ReadFile(ctx, alice, sb.ID, "file", 100); err != nil || string(b) != "kept\n" {
		t.Fatalf("file read on an auto-resume sandbox: %q, %v", b, err)
	}
	// Reads of its state do not resume it.
	if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Paused {
		t.Fatalf("a get resumed it: %s", got.State)
	}
	// Another tenant's call resumes nothing.
	if _, err := e.Svc.Exec(ctx, bob, sb.ID, ExecRequest{Command: []string{"true"}}); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("bob's exec: got %v, want NOT_FOUND", err)
	}
	if got, _ := e.Svc.Get(ctx, alice, sb.ID); got.State != Paused {
		t.Fatalf("bob's exec resumed it: %s", got.State)
	}
	// Bad create fields are refused.
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopAction: "hibernate"}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("autostop_action hibernate: got %v, want INVALID_ARGUMENT", err)
	}
}

func TestAutostopPauses(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	pausing, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60), AutostopAction: AutostopPause})
	if err != nil {
		t.Fatal(err)
	}
	stopping, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	if stopping.AutostopAction != AutostopStop {
		t.Fatalf("default autostop_action: got %q, want stop", stopping.AutostopAction)
	}
	// A first pass (the lookup is built: idle clocks count from then on).
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(2 * time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Svc.Get(ctx, alice, pausing.ID); got.State != Paused || !strings.Contains(got.StateReason, "auto-paused") {
		t.Fatalf("autostop_action pause: got %s %q, want PAUSED, auto-paused", got.State, got.StateReason)
	}
	if got, _ := e.Svc.Get(ctx, alice, stopping.ID); got.State != Stopped {
		t.Fatalf("autostop_action stop: got %s, want STOPPED", got.State)
	}
	// A sandbox that cannot be paused is stopped all the same.
	third, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60), AutostopAction: AutostopPause})
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(2 * time.Minute)
	e.Fake.FailNext("Pause", fmt.Errorf("no: %w", runtime.ErrUnsupported))
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Svc.Get(ctx, alice, third.ID); got.State != Stopped || !strings.Contains(got.StateReason, "could not be paused") {
		t.Fatalf("auto-pause on a runtime that cannot: got %s %q, want STOPPED saying why", got.State, got.StateReason)
	}
	// A sandbox whose pauses fail with it left running (a stuck guest, a runtime that cannot
	// save it) is stopped once three of them in a row failed.
	fourth, err := e.Svc.Create(ctx, alice, CreateRequest{AutostopSec: domaintest.Ptr[int64](60), AutostopAction: AutostopPause})
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(2 * time.Minute)
	for pass := 1; pass <= 3; pass++ {
		e.Fake.FailNext("Pause", errors.New("runsc checkpoint: the guest did not answer"))
		if err := e.Svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		got, _ := e.Svc.Get(ctx, alice, fourth.ID)
		switch {
		case pass < 3 && got.State != Running:
			t.Fatalf("after %d failed auto-pauses: got %s %q, want RUNNING (tried again)", pass, got.State, got.StateReason)
		case pass == 3 && (got.State != Stopped || !strings.Contains(got.StateReason, "could not be paused")):
			t.Fatalf("after %d failed auto-pauses: got %s %q, want STOPPED saying why", pass, got.State, got.StateReason)
		}
		e.Clock.Advance(2 * time.Minute) // the Get above was activity
	}
}

func TestReconcilerFinishesInterruptedPauseAndResume(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 2})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)
	// A replica died right after recording PAUSING: the box still runs.
	setRecordState(t, e, sb.ID, Pausing, e.Clock.Now().Add(-time.Minute))
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Paused {
		t.Fatalf("an interrupted pause: got %s %q, want PAUSED", got.State, got.StateReason)
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("quota after a finished pause: %d, want 0", u.InUse)
	}
	// A replica died right after recording RESUMING (it had taken the slot).
	if _, err := e.Svc.Quota(ctx, alice); err != nil {
		t.Fatal(err)
	}
	setRecordState(t, e, sb.ID, Resuming, e.Clock.Now().Add(-time.Minute))
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ = e.Svc.Get(ctx, alice, sb.ID)
	if got.State != Running || got.StateReason != "" {
		t.Fatalf("an interrupted resume: got %s %q, want RUNNING with its memory", got.State, got.StateReason)
	}
	if st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false); err != nil || st.State != ExecRunning {
		t.Fatalf("the loop after the reconciler's resume: %+v, %v, want RUNNING", st, err)
	}
	if u := e.Usage(t); u.InUse != 1 {
		t.Fatalf("quota after a finished resume: %d, want 1", u.InUse)
	}
}

// TestReconcilerFinishesAPauseCutAfterItsCheckpoint: the replica died after the runtime saved
// and ended the box, before the pause's one final record write (the state, the kept image and
// the workspace checkpoint together). The record says PAUSING and names no image; the
// reconciler finishes the pause on the image the runtime kept, and the resume brings the same
// processes back.
func TestReconcilerFinishesAPauseCutAfterItsCheckpoint(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 1})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)
	before, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	setRecordState(t, e, sb.ID, Pausing, e.Clock.Now().Add(-time.Minute))
	if err := e.Fake.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec := b.Record
	// The fake reads a workspace only through its guest (no runtime.WorkspaceExporter), which
	// the paused box no longer has: the reason says the snapshot is the older one. The record
	// names the kept image: pending, or already stored by the store that follows the pause.
	if State(rec.State) != Paused || !MemoryKept(rec) ||
		!strings.HasPrefix(rec.StateReason, "paused without a new workspace snapshot") {
		t.Fatalf("the finished pause: got %s %q, annotations %v, want PAUSED naming the kept image",
			rec.State, rec.StateReason, rec.Annotations)
	}
	if rec.LatestCheckpoint != before.Record.LatestCheckpoint {
		t.Fatalf("the latest checkpoint changed without a new one: %q (before: %q)", rec.LatestCheckpoint, before.Record.LatestCheckpoint)
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Fatalf("quota after a finished pause: %d, want 0", u.InUse)
	}
	waitImages(t, e.Ckpt.Derive(MemoryPrefix), sb.ID, 1)
	resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
	if err != nil || resumed.State != Running || resumed.StateReason != "" {
		t.Fatalf("resume: %+v, %v, want RUNNING with its memory", resumed, err)
	}
	if st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false); err != nil || st.State != ExecRunning {
		t.Fatalf("the loop after resume: %+v, %v, want RUNNING", st, err)
	}
}

// setRecordState writes a state into a sandbox's record as a replica that died would have left
// it.
func setRecordState(t *testing.T, e *domaintest.Env, id string, st State, at time.Time) {
	t.Helper()
	if _, err := e.Fake.UpdateRecord(context.Background(), id, func(r *runtime.Record) error {
		r.State, r.StateChangedAt = string(st), at
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPauseAnswersBeforeItsImageIsStored: a pause answers once the runtime keeps the image; the
// store's copy follows. A resume before it is stored (or after the store failed) restores from
// the runtime's copy; a failed store is done again by the reconciler; a store that ends after
// the sandbox moved on (resumed, stopped, destroyed) deletes what it stored; and with the
// runtime's copy gone before the store read it, the resume falls back to the workspace.
func TestPauseAnswersBeforeItsImageIsStored(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	mem := e.Ckpt.Derive(MemoryPrefix)
	pending := func(id string) string {
		t.Helper()
		b, err := e.Fake.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return b.Record.Annotations[AnnMemoryPending]
	}
	// opened waits until the pause's store has the image of each sandbox in hand.
	opened := func(g *runtimetest.ImageGate, ids ...string) {
		t.Helper()
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		for len(want) > 0 {
			select {
			case id := <-g.Opened():
				delete(want, id)
			case <-time.After(10 * time.Second):
				t.Fatalf("the store did not open the images of %v", want)
			}
		}
	}
	sb := e.CreateRunning(t, alice)
	loop := detached(t, e, sb.ID, "sh", "-c", appendLoop)

	t.Run("StoreFailsThenReconciled", func(t *testing.T) {
		e.Fake.FailNext("MemoryImage", errors.New("the disk is slow today"))
		paused, err := e.Svc.Pause(ctx, alice, sb.ID)
		if err != nil || paused.State != Paused || paused.StateReason != "" {
			t.Fatalf("pause: %+v, %v, want PAUSED", paused, err)
		}
		waitNoStores(t, e)
		waitImages(t, mem, sb.ID, 0)
		if pending(sb.ID) == "" {
			t.Fatal("after a failed store the record does not name the runtime's image")
		}
		// The reconciler stores it, not at once (the image is not read again on every pass),
		// but once the retry delay passed.
		if err := e.Svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		waitNoStores(t, e)
		waitImages(t, mem, sb.ID, 0)
		e.Clock.Advance(2 * time.Minute)
		if err := e.Svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		waitImages(t, mem, sb.ID, 1)
		waitNoStores(t, e)
		if p := pending(sb.ID); p != "" {
			t.Fatalf("after the store the record still names a pending image %q", p)
		}
		resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
		if err != nil || resumed.State != Running || resumed.StateReason != "" {
			t.Fatalf("resume: %+v, %v, want RUNNING with its memory", resumed, err)
		}
		waitImages(t, mem, sb.ID, 0)
	})

	t.Run("ResumeBeforeTheStore", func(t *testing.T) {
		gate := e.Fake.GateMemoryImages()
		defer gate.Open()
		if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
		opened(gate, sb.ID)
		if MemoryStores(e.Svc.Core) != 1 {
			t.Fatalf("stores in flight after the pause's answer: %d, want 1", MemoryStores(e.Svc.Core))
		}
		resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
		if err != nil || resumed.State != Running || resumed.StateReason != "" {
			t.Fatalf("resume while the image is stored: %+v, %v, want RUNNING with its memory", resumed, err)
		}
		if st, err := e.Svc.GetExec(ctx, alice, sb.ID, loop.ExecID, false); err != nil || st.State != ExecRunning {
			t.Fatalf("the loop after resume: %+v, %v, want RUNNING", st, err)
		}
		// The store ends after the resume: what it stored is nobody's, and goes.
		gate.Open()
		waitNoStores(t, e)
		waitImages(t, mem, sb.ID, 0)
		if p := pending(sb.ID); p != "" {
			t.Fatalf("a running sandbox's record names a pending image %q", p)
		}
	})

	t.Run("StopAndDestroyBeforeTheStore", func(t *testing.T) {
		gate := e.Fake.GateMemoryImages()
		defer gate.Open()
		other := e.CreateRunning(t, alice)
		for _, id := range []string{sb.ID, other.ID} {
			if _, err := e.Svc.Pause(ctx, alice, id); err != nil {
				t.Fatal(err)
			}
		}
		opened(gate, sb.ID, other.ID)
		if st, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil || st.State != Stopped {
			t.Fatalf("stop of a PAUSED sandbox whose image is being stored: %+v, %v", st, err)
		}
		if _, err := e.Svc.Destroy(ctx, alice, other.ID); err != nil {
			t.Fatal(err)
		}
		gate.Open()
		waitNoStores(t, e)
		waitImages(t, mem, sb.ID, 0)
		waitImages(t, mem, other.ID, 0)
		if _, err := e.Svc.Start(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("KeptCopyLost", func(t *testing.T) {
		// The store had opened the image when the runtime's copy went: its copy serves.
		gate := e.Fake.GateMemoryImages()
		if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
		opened(gate, sb.ID)
		dropKept(t, e, sb.ID)
		gate.Open()
		waitNoStores(t, e)
		waitImages(t, mem, sb.ID, 1)
		resumed, err := e.Svc.Resume(ctx, alice, sb.ID)
		if err != nil || resumed.State != Running || resumed.StateReason != "" {
			t.Fatalf("resume from the stored copy: %+v, %v, want RUNNING with its memory", resumed, err)
		}
		// The store failed and the runtime's copy went: the workspace, saying why.
		e.Fake.FailNext("MemoryImage", errors.New("the disk is slow today"))
		if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
		waitNoStores(t, e)
		dropKept(t, e, sb.ID)
		resumed, err = e.Svc.Resume(ctx, alice, sb.ID)
		if err != nil || resumed.State != Running || !strings.Contains(resumed.StateReason, "memory not restored") ||
			!strings.Contains(resumed.StateReason, "never stored") {
			t.Fatalf("resume without any copy: %+v, %v, want RUNNING on its workspace, saying the image was never stored", resumed, err)
		}
		waitImages(t, mem, sb.ID, 0)
	})
}
