package apitest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var user = auth.Principal{Key: "user", Tenant: "acme", Project: "web"}

// TestSpecialSandboxes: every verb that names a sandbox answers the special ids the same way.
func TestSpecialSandboxes(t *testing.T) {
	f := New()
	ctx := context.Background()
	for _, tt := range []struct {
		id   string
		code apierror.Code // "" for an uncoded error
	}{
		{SandboxBusy, apierror.InvalidState},
		{SandboxBoom, ""},
		{"sbx_other", apierror.NotFound},
	} {
		t.Run(tt.id, func(t *testing.T) {
			for name, call := range map[string]func() error{
				"Get":      func() error { _, err := f.Get(ctx, user, tt.id); return err },
				"Exec":     func() error { _, err := f.Exec(ctx, user, tt.id, sandbox.ExecRequest{}); return err },
				"ReadFile": func() error { _, _, err := f.ReadFile(ctx, user, tt.id, "a", 10); return err },
				"Snapshot": func() error { _, err := f.Snapshot(ctx, user, tt.id); return err },
				"Events": func() error {
					return f.EventsFunc(ctx, user, tt.id, "", func(sandbox.Event) bool { return true }, func() {})
				},
			} {
				err := call()
				var ae *apierror.Error
				coded := errors.As(err, &ae)
				switch {
				case err == nil:
					t.Errorf("%s: got no error, want one", name)
				case tt.code == "" && (coded || err.Error() != SecretCause):
					t.Errorf("%s: got %v, want the uncoded secret cause", name, err)
				case tt.code != "" && (!coded || ae.Code != tt.code):
					t.Errorf("%s: got %v, want %s", name, err, tt.code)
				}
			}
		})
	}
	defer func() {
		if recover() == nil {
			t.Error("Get of SandboxPanic did not panic")
		}
	}()
	_, _ = f.Get(ctx, user, SandboxPanic)
}

// TestCallLog: every call is logged with its arguments, also one that fails.
func TestCallLog(t *testing.T) {
	f := New()
	ctx := context.Background()
	_, _ = f.Exec(ctx, user, SandboxRunning, sandbox.ExecRequest{Command: []string{"true"}, Detach: true})
	_, _ = f.GetExec(ctx, user, "", "exec_nope", true)
	_ = f.Profiles()
	if got, want := f.Called(), []string{"Exec", "GetExec", "Profiles"}; !slices.Equal(got, want) {
		t.Fatalf("got calls %v, want %v", got, want)
	}
	if c := f.Last("Exec"); c.SandboxID != SandboxRunning || !c.Exec.Detach || c.Principal != user {
		t.Errorf("got Exec call %+v, want the sandbox, the request and the principal", c)
	}
	if c := f.Last("GetExec"); c.ID != "exec_nope" || !c.Output {
		t.Errorf("got GetExec call %+v, want exec_nope with output", c)
	}
	if p := f.LastPrincipal(); p != (auth.Principal{}) {
		t.Errorf("got last principal %+v, want none (Profiles takes none)", p)
	}
	if c := f.Last("Stop"); c.Method != "" {
		t.Errorf("got %+v for a method never called, want a zero Call", c)
	}
}

// TestGetExecOutput: the output and its truncated flags come only when asked for.
func TestGetExecOutput(t *testing.T) {
	f := New()
	ctx := context.Background()
	res, err := f.GetExec(ctx, user, "", ExecEnded, false)
	if err != nil || res.Stdout != nil || res.Stderr != nil || res.StderrTruncated || res.OutputBytes != 11 {
		t.Errorf("without output: got %+v %v, want the status only", res, err)
	}
	res, err = f.GetExec(ctx, user, SandboxRunning, ExecEnded, true)
	if err != nil || string(res.Stdout) != "hello\n" || string(res.Stderr) != "oops\xff" || !res.StderrTruncated {
		t.Errorf("with output: got %+v %v, want stdout, stderr and the truncated flag", res, err)
	}
	if _, err := f.GetExec(ctx, user, "sbx_other", ExecEnded, true); !isCode(err, apierror.NotFound) {
		t.Errorf("of another sandbox: got %v, want NOT_FOUND", err)
	}
}

// TestExecOutputStreams: replay after the cursor, then close (drained), follow endlessly or
// hold; a stream that is not drained ends with its subscriber's ctx, and closes then too.
func TestExecOutputStreams(t *testing.T) {
	evs := []sandbox.ExecEvent{{Kind: sandbox.ExecChunk, Cursor: "1-0"}, {Kind: sandbox.ExecChunk, Cursor: "2-0"},
		{Kind: sandbox.ExecExit, Cursor: "3-0"}}
	for _, tt := range []struct {
		name, after string
		endless     []byte
		hold        bool
		take        int
		// then is what follows the events taken: "closed", "more" or "silence".
		then string
	}{
		{name: "replay", take: 3, then: "closed"},
		{name: "after-cursor", after: "1-0", take: 2, then: "closed"},
		{name: "endless", endless: []byte("x"), take: 10, then: "more"},
		{name: "hold", hold: true, take: 3, then: "silence"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := New()
			f.ExecEvents[ExecEnded], f.ExecEndless, f.ExecHold = evs, tt.endless, tt.hold
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := f.ExecOutput(ctx, user, ExecEnded, tt.after)
			if err != nil {
				t.Fatal(err)
			}
			f.WaitSubscribed(t, time.Second)
			for i := range tt.take {
				if _, ok := <-ch; !ok {
					t.Fatalf("the stream closed after %d events, want %d", i, tt.take)
				}
			}
			then := "silence"
			select {
			case _, ok := <-ch:
				then = map[bool]string{true: "more", false: "closed"}[ok]
			case <-time.After(50 * time.Millisecond):
			}
			if then != tt.then {
				t.Errorf("after %d events: got %s, want %s", tt.take, then, tt.then)
			}
			cancel()
			for range ch {
			}
			end := <-f.ExecDone()
			if drained := tt.then == "closed"; end.Drained != drained || (drained && end.Sent != tt.take) || end.Sent < tt.take {
				t.Errorf("got %+v, want %d sent (at least), drained %v", end, tt.take, drained)
			}
			f.WaitStreams(t, time.Second)
		})
	}
	f := New()
	if _, err := f.ExecOutput(context.Background(), user, ExecEnded, BadCursor); !isCode(err, apierror.InvalidArgument) {
		t.Errorf("bad cursor: got %v, want INVALID_ARGUMENT", err)
	}
	if _, err := f.ExecOutput(context.Background(), user, "exec_nope", ""); !isCode(err, apierror.NotFound) {
		t.Errorf("unknown exec: got %v, want NOT_FOUND", err)
	}
}

// TestAgentRuns: list order, cancel in place, the default event stream.
func TestAgentRuns(t *testing.T) {
	f := New()
	ctx := context.Background()
	runs, err := f.ListAgentRuns(ctx, user, SandboxRunning)
	if err != nil || len(runs) != 2 || runs[0].ID != RunDone || runs[1].ID != RunRunning {
		t.Fatalf("got %+v %v, want RunDone then RunRunning", runs, err)
	}
	if _, err := f.ListAgentRuns(ctx, user, ""); !isCode(err, apierror.InvalidArgument) {
		t.Errorf("list without a sandbox: got %v, want INVALID_ARGUMENT", err)
	}
	if r, err := f.CancelAgentRun(ctx, user, RunRunning); err != nil || r.Status != sandbox.RunCancelled {
		t.Errorf("cancel: got %+v %v, want CANCELLED", r, err)
	}
	if _, err := f.CancelAgentRun(ctx, user, RunRunning); !isCode(err, apierror.InvalidState) {
		t.Errorf("cancel again: got %v, want INVALID_STATE", err)
	}
	ch, err := f.AgentRunEvents(ctx, user, RunDone, "3-0")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []sandbox.AgentRunEventKind
	var last sandbox.AgentRunEvent
	for ev := range ch {
		kinds, last = append(kinds, ev.Kind), ev
	}
	if len(kinds) != 4 || kinds[0] != sandbox.AgentRunStatusEvent || last.Run == nil || last.Run.ID != RunDone ||
		last.Run.Status != sandbox.RunSucceeded {
		t.Errorf("got %v ending with %+v, want status, chunk, gap and the run SUCCEEDED", kinds, last.Run)
	}
	f.WaitStreams(t, time.Second)
}

func isCode(err error, c apierror.Code) bool {
	var ae *apierror.Error
	return errors.As(err, &ae) && ae.Code == c
}
