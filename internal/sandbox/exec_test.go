package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
)

// collect reads an exec's output events to the end (or the deadline).
func collect(t *testing.T, ch <-chan ExecEvent) (stdout, stderr []byte, evs []ExecEvent) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return stdout, stderr, evs
			}
			evs = append(evs, ev)
			if ev.Kind == ExecChunk {
				if ev.Stream == "stderr" {
					stderr = append(stderr, ev.Data...)
				} else {
					stdout = append(stdout, ev.Data...)
				}
			}
		case <-deadline:
			t.Fatalf("the exec's output did not end; %d events so far", len(evs))
		}
	}
}

func createRunning(t *testing.T, e *env, p auth.Principal) Sandbox {
	t.Helper()
	sb, err := e.svc.Create(context.Background(), p, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestExecWaitsAndIsReadableAfterwards(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	res := mustExec(t, e, alice, sb.ID, "sh", "-c", "echo out; echo err >&2; exit 3")
	if res.State != ExecEnded || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" ||
		res.SandboxID != sb.ID || res.Command != "sh -c 'echo out; echo err >&2; exit 3'" {
		t.Fatalf("exec: got %+v", res)
	}
	got, err := e.svc.GetExec(ctx, alice, sb.ID, res.ExecID, true)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != ExecEnded || got.ExitCode != 3 || string(got.Stdout) != "out\n" || string(got.Stderr) != "err\n" || got.OutputBytes != 8 {
		t.Fatalf("GetExec: got %+v", got)
	}
	// Any replica serves the output, replayed from the start and from a cursor.
	other := e.replica(t)
	ch, err := other.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, evs := collect(t, ch)
	if string(stdout) != "out\n" || string(stderr) != "err\n" {
		t.Fatalf("output: got %q / %q", stdout, stderr)
	}
	last := evs[len(evs)-1]
	if last.Kind != ExecExit || last.Result == nil || last.Result.ExitCode != 3 || last.Result.State != ExecEnded {
		t.Fatalf("last event: got %+v", last)
	}
	ch, err = other.ExecOutput(ctx, alice, res.ExecID, evs[0].Cursor)
	if err != nil {
		t.Fatal(err)
	}
	_, _, rest := collect(t, ch)
	if len(rest) != len(evs)-1 || rest[0].Cursor != evs[1].Cursor {
		t.Fatalf("resume after the first event: got %d events, want %d", len(rest), len(evs)-1)
	}
}

func TestExecOfAnotherTenantOrSandboxIsNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	sb2 := createRunning(t, e, alice)
	res := mustExec(t, e, alice, sb.ID, "true")
	for name, call := range map[string]func() error{
		"other tenant get":    func() error { _, err := e.svc.GetExec(ctx, bob, "", res.ExecID, false); return err },
		"other tenant output": func() error { _, err := e.svc.ExecOutput(ctx, bob, res.ExecID, ""); return err },
		"other sandbox":       func() error { _, err := e.svc.GetExec(ctx, alice, sb2.ID, res.ExecID, false); return err },
		"unknown": func() error {
			_, err := e.svc.GetExec(ctx, alice, "", "exec_01ARZ3NDEKTSV4RRFFQ69G5FAV", false)
			return err
		},
		"malformed": func() error { _, err := e.svc.ExecOutput(ctx, alice, "../x", ""); return err },
	} {
		if code := apierror.CodeOf(call()); code != apierror.NotFound {
			t.Errorf("%s: got %s, want NOT_FOUND", name, code)
		}
	}
	for _, cur := range []string{"x", "99999999-0", "1-2-3"} {
		if _, err := e.svc.ExecOutput(ctx, alice, res.ExecID, cur); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("cursor %q: got %v, want INVALID_ARGUMENT", cur, err)
		}
	}
}

// TestDetachedExecIsFollowedOnByAnotherReplica: the replica that started a command goes away
// mid-stream; another replica's reconciler follows on from the stored offset and a subscriber
// on it gets every line once, then the exit status.
func TestDetachedExecIsFollowedOnByAnotherReplica(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	first := e.replica(t)
	res, err := first.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"sh", "-c", "for i in $(seq 1 60); do echo line $i; sleep 0.02; done; exit 7"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != ExecRunning || res.ExecID == "" {
		t.Fatalf("detached exec: got %+v", res)
	}
	ch, err := e.svc.ExecOutput(ctx, alice, res.ExecID, "")
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
			if err := e.svc.Reconcile(ctx); err != nil {
				t.Errorf("reconcile: %v", err)
			}
			m, err := e.svc.execs.Get(ctx, res.ExecID)
			if err == nil && m.Follower == e.svc.token {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	rest, _, evs := collect(t, ch)
	<-done
	out = append(out, rest...)
	var want strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if string(out) != want.String() {
		t.Fatalf("output across the takeover:\ngot  %q\nwant %q", out, want.String())
	}
	if last := evs[len(evs)-1]; last.Kind != ExecExit || last.Result.ExitCode != 7 {
		t.Fatalf("last event: got %+v", last)
	}
}

func TestExecEndsWhenTheSandboxStops(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := createRunning(t, e, alice)
	res, err := e.svc.Exec(ctx, alice, sb.ID, ExecRequest{Command: []string{"sleep", "60"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := e.svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, _, evs := collect(t, ch)
	last := evs[len(evs)-1]
	if last.Kind != ExecExit || last.Result.Error == "" {
		t.Fatalf("last event: got %+v", last)
	}
	got, err := e.svc.GetExec(ctx, alice, "", res.ExecID, false)
	if err != nil || got.State != ExecEnded || got.Error == "" {
		t.Fatalf("GetExec after the stop: %+v, %v", got, err)
	}
}

func TestExecEventsOnTheSandboxStream(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sb := createRunning(t, e, alice)
	evs, err := e.svc.Events(ctx, alice, sb.ID, "0-0")
	if err != nil {
		t.Fatal(err)
	}
	res := mustExec(t, e, alice, sb.ID, "sh", "-c", "exit 2")
	var types []string
	for ev := range evs {
		if ev.Exec == nil {
			continue
		}
		if ev.Exec.ExecID != res.ExecID {
			t.Fatalf("exec event of another exec: %+v", ev.Exec)
		}
		types = append(types, ev.Type)
		if ev.Type == EventExecEnded {
			if ev.Exec.State != ExecEnded || ev.Exec.ExitCode != 2 {
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
	e := newEnv(t)
	sb := createRunning(t, e, alice)
	in := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	res, err := e.svc.Exec(context.Background(), alice, sb.ID, ExecRequest{Command: []string{"cat"}, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, in) || res.ExitCode != 0 {
		t.Fatalf("cat of 1 MiB: got %d bytes, exit %d", len(res.Stdout), res.ExitCode)
	}
	ch, err := e.svc.ExecOutput(context.Background(), alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, _, _ := collect(t, ch)
	if !bytes.Equal(stdout, in) {
		t.Fatalf("streamed output: got %d bytes, want %d", len(stdout), len(in))
	}
}
