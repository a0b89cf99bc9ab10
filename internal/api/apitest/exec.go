package apitest

import (
	"context"
	"fmt"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// EndedExec is ExecEnded's status: "'make' 'test'" in SandboxRunning, exit code 3 after
// 1.5 s, 11 bytes of output (not included).
func EndedExec() sandbox.ExecResult {
	return sandbox.ExecResult{ExecID: ExecEnded, SandboxID: SandboxRunning, Command: "'make' 'test'", State: sandbox.ExecEnded,
		ExitCode: 3, Duration: 1500 * time.Millisecond, StartedAt: T0, EndedAt: T0.Add(1500 * time.Millisecond), OutputBytes: 11}
}

// RunningExec is ExecRunning's status in sandboxID: "'sleep' '60'", RUNNING since T0, 12
// bytes of output so far (not included). A detached Exec answers it.
func RunningExec(sandboxID string) sandbox.ExecResult {
	return sandbox.ExecResult{ExecID: ExecRunning, SandboxID: sandboxID, Command: "'sleep' '60'",
		State: sandbox.ExecRunning, StartedAt: T0, OutputBytes: 12}
}

// withOutput adds the output GetExec answers when asked for it.
func withOutput(res sandbox.ExecResult) sandbox.ExecResult {
	res.Stdout, res.Stderr, res.StderrTruncated = []byte("hello\n"), []byte("oops\xff"), true
	return res
}

// Exec answers ExecErr, then ExecResult when set; else RunningExec for a detached exec, and
// for a waited one ExecEnded with ExecStdout (truncated) and stderr "warn\n".
func (f *Fake) Exec(_ context.Context, p auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	f.record(Call{Method: "Exec", Principal: p, SandboxID: id, Exec: req})
	f.mu.Lock()
	execErr, answer, stdout := f.ExecErr, f.ExecResult, f.ExecStdout
	f.mu.Unlock()
	if execErr != nil {
		return sandbox.ExecResult{}, execErr
	}
	if _, err := lookup(p, id); err != nil {
		return sandbox.ExecResult{}, err
	}
	switch {
	case answer != nil:
		return *answer, nil
	case req.Detach:
		return RunningExec(id), nil
	}
	return sandbox.ExecResult{ExecID: ExecEnded, SandboxID: id, Command: "cat", State: sandbox.ExecEnded, ExitCode: 3,
		Duration: 1500 * time.Millisecond, StartedAt: T0, EndedAt: T0.Add(1500 * time.Millisecond), Stdout: stdout,
		Stderr: []byte("warn\n"), StdoutTruncated: true, OutputBytes: int64(len(stdout)) + 5}, nil
}

// GetExec answers Execs[execID]; an exec of another sandbox than a named one is NOT_FOUND.
// Without output the answer has no output and no truncated flags.
func (f *Fake) GetExec(_ context.Context, p auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error) {
	f.record(Call{Method: "GetExec", Principal: p, SandboxID: sandboxID, ID: execID, Output: output})
	f.mu.Lock()
	res, ok := f.Execs[execID]
	f.mu.Unlock()
	if !ok || (sandboxID != "" && sandboxID != res.SandboxID) {
		return sandbox.ExecResult{}, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if !output {
		res.Stdout, res.Stderr, res.StdoutTruncated, res.StderrTruncated = nil, nil, false, false
	}
	return res, nil
}

// ExecOutputStatus is GetExec without output, then ExecOutput (both calls are recorded).
func (f *Fake) ExecOutputStatus(ctx context.Context, p auth.Principal, sandboxID, execID, after string) (sandbox.ExecResult, <-chan sandbox.ExecEvent, error) {
	st, err := f.GetExec(ctx, p, sandboxID, execID, false)
	if err != nil {
		return sandbox.ExecResult{}, nil, err
	}
	ch, err := f.ExecOutput(ctx, p, execID, after)
	return st, ch, err
}

// ExecOutput follows a known exec: OutputErr, NOT_FOUND, INVALID_ARGUMENT for BadCursor, else
// ExecEvents[execID] after the cursor, as the domain replays them (see Fake for what follows).
func (f *Fake) ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error) {
	f.record(Call{Method: "ExecOutput", Principal: p, ID: execID, After: after})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.OutputErr != nil {
		return nil, f.OutputErr
	}
	if _, ok := f.Execs[execID]; !ok {
		return nil, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if after == BadCursor {
		return nil, apierror.New(apierror.InvalidArgument, "bad cursor %q", after).WithDetail("field", "after")
	}
	evs := f.ExecEvents[execID]
	for i, ev := range evs {
		if ev.Cursor == after {
			evs = evs[i+1:]
			break
		}
	}
	evs = append([]sandbox.ExecEvent(nil), evs...)
	endless, hold := f.ExecEndless, f.ExecHold
	out := make(chan sandbox.ExecEvent)
	f.streams.Add(1)
	signal(f.subscribed, struct{}{})
	go func() {
		defer f.streams.Done()
		end := ExecStreamEnd{}
		defer func() { signal(f.execDone, end) }()
		defer close(out)
		for _, e := range evs {
			select {
			case out <- e:
				end.Sent++
			case <-ctx.Done():
				return
			}
		}
		switch {
		case endless != nil:
			for i := 0; ; i++ {
				select {
				case out <- sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: fmt.Sprintf("%d-0", i), Stream: "stdout", Data: endless}:
					end.Sent++
				case <-ctx.Done():
					return
				}
			}
		case hold:
			<-ctx.Done()
			return
		}
		end.Drained = true
	}()
	return out, nil
}
