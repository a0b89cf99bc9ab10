package execs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/execs"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

var alice, bob = domaintest.Alice, domaintest.Bob

func TestExecWaitsAndIsReadableAfterwards(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res := e.MustExec(t, alice, sb.ID, "sh", "-c", "echo out; echo err >&2; exit 3")
	if res.State != sandbox.ExecEnded || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" ||
		res.SandboxID != sb.ID || res.Command != "sh -c 'echo out; echo err >&2; exit 3'" {
		t.Fatalf("exec: got %+v", res)
	}
	got, err := e.Svc.GetExec(ctx, alice, sb.ID, res.ExecID, true)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != sandbox.ExecEnded || got.ExitCode != 3 || string(got.Stdout) != "out\n" || string(got.Stderr) != "err\n" || got.OutputBytes != 8 {
		t.Fatalf("GetExec: got %+v", got)
	}
	// Any replica serves the output, replayed from the start and from a cursor.
	other := e.Replica(t)
	ch, err := other.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, evs := domaintest.Collect(t, ch)
	if string(stdout) != "out\n" || string(stderr) != "err\n" {
		t.Fatalf("output: got %q / %q", stdout, stderr)
	}
	last := evs[len(evs)-1]
	if last.Kind != sandbox.ExecExit || last.Result == nil || last.Result.ExitCode != 3 || last.Result.State != sandbox.ExecEnded {
		t.Fatalf("last event: got %+v", last)
	}
	ch, err = other.ExecOutput(ctx, alice, res.ExecID, evs[0].Cursor)
	if err != nil {
		t.Fatal(err)
	}
	_, _, rest := domaintest.Collect(t, ch)
	if len(rest) != len(evs)-1 || rest[0].Cursor != evs[1].Cursor {
		t.Fatalf("resume after the first event: got %d events, want %d", len(rest), len(evs)-1)
	}
}

func TestExecOfAnotherTenantOrSandboxIsNotFound(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	sb2 := e.CreateRunning(t, alice)
	res := e.MustExec(t, alice, sb.ID, "true")
	for name, call := range map[string]func() error{
		"other tenant get":    func() error { _, err := e.Svc.GetExec(ctx, bob, "", res.ExecID, false); return err },
		"other tenant output": func() error { _, err := e.Svc.ExecOutput(ctx, bob, res.ExecID, ""); return err },
		"other sandbox":       func() error { _, err := e.Svc.GetExec(ctx, alice, sb2.ID, res.ExecID, false); return err },
		"unknown": func() error {
			_, err := e.Svc.GetExec(ctx, alice, "", "exec_01ARZ3NDEKTSV4RRFFQ69G5FAV", false)
			return err
		},
		"malformed": func() error { _, err := e.Svc.ExecOutput(ctx, alice, "../x", ""); return err },
	} {
		if code := apierror.CodeOf(call()); code != apierror.NotFound {
			t.Errorf("%s: got %s, want NOT_FOUND", name, code)
		}
	}
	for _, cur := range []string{"x", "99999999-0", "1-2-3"} {
		if _, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, cur); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("cursor %q: got %v, want INVALID_ARGUMENT", cur, err)
		}
	}
}

// TestDetachedExecIsFollowedOnByAnotherReplica: the replica that started a command goes away
// mid-stream; another replica's reconciler follows on from the stored offset and a subscriber
// on it gets every line once, then the exit status.
func TestDetachedExecIsFollowedOnByAnotherReplica(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	first := e.Replica(t)
	res, err := first.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "for i in $(seq 1 60); do echo line $i; sleep 0.02; done; exit 7"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != sandbox.ExecRunning || res.ExecID == "" {
		t.Fatalf("detached exec: got %+v", res)
	}
	ch, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for len(out) < 40 {
		ev := <-ch
		out = append(out, ev.Data...)
	}
	first.Close() // hands the lease back
	deadline := time.Now().Add(30 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for time.Now().Before(deadline) {
			if err := e.Svc.Reconcile(ctx); err != nil {
				t.Errorf("reconcile: %v", err)
			}
			m, err := execs.Store(e.Svc.Execs).Get(ctx, res.ExecID)
			if err == nil && m.Follower == execs.Token(e.Svc.Execs) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	rest, _, evs := domaintest.Collect(t, ch)
	<-done
	out = append(out, rest...)
	var want strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if string(out) != want.String() {
		t.Fatalf("output across the takeover:\ngot  %q\nwant %q", out, want.String())
	}
	if last := evs[len(evs)-1]; last.Kind != sandbox.ExecExit || last.Result.ExitCode != 7 {
		t.Fatalf("last event: got %+v", last)
	}
}

func TestExecEndsWhenTheSandboxStops(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res, err := e.Svc.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sleep", "60"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, _, evs := domaintest.Collect(t, ch)
	last := evs[len(evs)-1]
	if last.Kind != sandbox.ExecExit || last.Result.Error == "" {
		t.Fatalf("last event: got %+v", last)
	}
	got, err := e.Svc.GetExec(ctx, alice, "", res.ExecID, false)
	if err != nil || got.State != sandbox.ExecEnded || got.Error == "" {
		t.Fatalf("GetExec after the stop: %+v, %v", got, err)
	}
}

func TestExecEventsOnTheSandboxStream(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sb := e.CreateRunning(t, alice)
	evs, err := domaintest.Events(ctx, e.Svc, alice, sb.ID, "0-0")
	if err != nil {
		t.Fatal(err)
	}
	res := e.MustExec(t, alice, sb.ID, "sh", "-c", "exit 2")
	var types []string
	for ev := range evs {
		if ev.Exec == nil {
			continue
		}
		if ev.Exec.ExecID != res.ExecID {
			t.Fatalf("exec event of another exec: %+v", ev.Exec)
		}
		types = append(types, ev.Type)
		if ev.Type == sandbox.EventExecEnded {
			if ev.Exec.State != sandbox.ExecEnded || ev.Exec.ExitCode != 2 {
				t.Fatalf("EXEC_ENDED: got %+v", ev.Exec)
			}
			break
		}
	}
	if strings.Join(types, ",") != "EXEC_STARTED,EXEC_ENDED" {
		t.Fatalf("exec events: got %v", types)
	}
}

func TestExecWithStdinAndLargeOutput(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	sb := e.CreateRunning(t, alice)
	in := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	res, err := e.Svc.Exec(context.Background(), alice, sb.ID, sandbox.ExecRequest{Command: []string{"cat"}, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, in) || res.ExitCode != 0 {
		t.Fatalf("cat of 1 MiB: got %d bytes, exit %d", len(res.Stdout), res.ExitCode)
	}
	ch, err := e.Svc.ExecOutput(context.Background(), alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, _, _ := domaintest.Collect(t, ch)
	if !bytes.Equal(stdout, in) {
		t.Fatalf("streamed output: got %d bytes, want %d", len(stdout), len(in))
	}
}

// TestEndedExecIsIndexedByItsAnswer: by the time a waiting caller gets an exec's result, the
// exec stands in the ended index that the sweep reads (its follower moved it, beside the
// EXEC_ENDED event), without waiting for a reconciler pass to repair the index.
func TestEndedExecIsIndexedByItsAnswer(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res := e.MustExec(t, alice, sb.ID, "true")
	store := execstream.New(e.Redis.Client, execstream.Options{Retention: time.Minute, Now: e.Clock.Now})
	n, err := store.Sweep(ctx, e.Clock.Now().Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("a sweep past the retention right after the answer: swept %d (%v), want the ended exec", n, err)
	}
	if _, err := store.Get(ctx, res.ExecID); !errors.Is(err, execstream.ErrNotFound) {
		t.Fatalf("the swept exec: %v, want ErrNotFound", err)
	}
}

// TestWaitedExecAcrossAPause: a waited exec whose sandbox is paused while the command runs
// answers once its timeout and the grace after it passed, with INVALID_STATE naming the state
// and the exec's id (not UNAVAILABLE, which says the sandbox looks stuck); the exec goes on
// after the resume and ends.
func TestWaitedExecAcrossAPause(t *testing.T) {
	execs.SetEndGrace(t, 300*time.Millisecond)
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	answered := execInBackground(e, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "sleep 2; echo done"},
		TimeoutSec: domaintest.Ptr[int64](1)})
	time.Sleep(200 * time.Millisecond)
	if _, err := e.Svc.Pause(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	a := awaitAnswer(t, answered, 20*time.Second)
	ae := apierror.From(a.err)
	execID, _ := ae.Details["exec_id"].(string)
	if ae.Code != apierror.InvalidState || ae.Details["state"] != string(sandbox.Paused) || execID == "" {
		t.Fatalf("got %v (details %v), want INVALID_STATE naming PAUSED and the exec", a.err, ae.Details)
	}
	if _, err := e.Svc.Resume(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, e, execID) // fails unless the exec's stream ends with its exit
}
