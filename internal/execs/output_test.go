package execs_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/execs"
	"sandboxd/internal/execstream"
	"sandboxd/internal/sandbox"
)

// The guest's log keeps the newest 64 MiB by default (the fake's guest server uses the
// default): these commands write more than that.
const (
	bigOutput = 70_000_000
	bigTail   = "\nTHE END\n"
	bigCmd    = "head -c 70000000 /dev/zero | tr '\\000' y; printf '\\nTHE END\\n'"
)

// TestExecKeepsTheNewestOutput: a synchronous exec that writes more than every bound answers
// the newest bytes with stdout_truncated, and its output_bytes is exactly what it wrote, in
// the answer, the status and the exit event.
func TestExecKeepsTheNewestOutput(t *testing.T) {
	const limit = 64 << 10
	e := domaintest.New(t, domaintest.Options{Config: func(c *sandbox.Config) { c.Limits.ExecMaxOutputBytes = limit }})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	res, err := e.Svc.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", bigCmd}})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("y"), limit-len(bigTail))
	want = append(want, bigTail...)
	if !bytes.Equal(res.Stdout, want) || !res.StdoutTruncated || res.StderrTruncated || len(res.Stderr) != 0 {
		t.Errorf("exec: got %d bytes ending %q, truncated %v/%v, want the last %d bytes, stdout truncated only",
			len(res.Stdout), tail(res.Stdout), res.StdoutTruncated, res.StderrTruncated, limit)
	}
	if res.OutputBytes != bigOutput+int64(len(bigTail)) {
		t.Errorf("exec output_bytes: got %d, want %d", res.OutputBytes, bigOutput+len(bigTail))
	}
	got, err := e.Svc.GetExec(ctx, alice, sb.ID, res.ExecID, true)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Stdout, want) || !got.StdoutTruncated || got.StderrTruncated || got.OutputBytes != res.OutputBytes {
		t.Errorf("GetExec: got %d bytes ending %q, truncated %v/%v, output_bytes %d; want the last %d bytes and %d",
			len(got.Stdout), tail(got.Stdout), got.StdoutTruncated, got.StderrTruncated, got.OutputBytes, limit, res.OutputBytes)
	}
	ch, err := e.Svc.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, _, evs := domaintest.Collect(t, ch)
	if evs[0].Kind != sandbox.ExecTruncated || evs[0].MissedBytes <= 0 {
		t.Errorf("first event: got %s (missed %d), want TRUNCATED", evs[0].Kind, evs[0].MissedBytes)
	}
	if !bytes.HasSuffix(stdout, want) {
		t.Errorf("streamed output: ends %q, want the output's end", tail(stdout))
	}
	last := evs[len(evs)-1]
	if last.Kind != sandbox.ExecExit || last.Result.OutputBytes != res.OutputBytes {
		t.Errorf("last event: got %s with output_bytes %d, want EXIT with %d", last.Kind, last.Result.OutputBytes, res.OutputBytes)
	}
}

// TestTakeoverAfterTheLogDroppedOutput: nobody follows a command while it writes more than the
// guest's log keeps; the replica that follows on afterwards gets the guest's truncation marker
// and every subscriber sees TRUNCATED with exactly the bytes the guest dropped, then the newest
// output, then the exit with the exact byte count.
func TestTakeoverAfterTheLogDroppedOutput(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	// Replicas whose Redis streams hold the whole guest log (and whose ended execs may hold as
	// much, as sandboxd's config requires), so that the only hole is the guest's own.
	base := e.NewDeps
	e.NewDeps = func() domain.Deps {
		d := base()
		d.Execs = execstream.New(e.Redis.Client, execstream.Options{MaxBytes: 256 << 20, MaxEndedBytes: 256 << 20, Now: e.Clock.Now, Block: 200 * time.Millisecond})
		return d
	}
	first, second := e.Replica(t), e.Replica(t)
	res, err := first.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "sleep 0.5; " + bigCmd}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	first.Close() // nobody follows while the command writes

	g, err := second.Guest(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := g.Exec(ctx, res.ExecID)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not end")
		}
		time.Sleep(50 * time.Millisecond)
	}
	lr, err := g.Log(ctx, res.ExecID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := lr.Next()
	lr.Close()
	if err != nil || marker.Kind != proto.RecordTruncated || marker.Missed <= 0 {
		t.Fatalf("the guest log from 0: got %+v %v, want a truncation marker", marker, err)
	}

	if err := second.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := second.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	stdout, _, evs := domaintest.Collect(t, ch)
	if evs[0].Kind != sandbox.ExecTruncated || evs[0].MissedBytes != marker.Missed {
		t.Fatalf("first event: got %s (missed %d), want TRUNCATED missing %d", evs[0].Kind, evs[0].MissedBytes, marker.Missed)
	}
	for i, ev := range evs[1 : len(evs)-1] {
		if ev.Kind != sandbox.ExecChunk {
			t.Fatalf("event %d: got %s, want only chunks after the marker", i+1, ev.Kind)
		}
	}
	if len(stdout) < 56<<20 || !strings.HasSuffix(string(stdout), "yyy"+bigTail) || strings.Trim(string(stdout[:len(stdout)-len(bigTail)]), "y") != "" {
		t.Errorf("output after the marker: %d bytes ending %q, want the newest ≥ 56 MiB of the output", len(stdout), tail(stdout))
	}
	last := evs[len(evs)-1]
	if last.Kind != sandbox.ExecExit || last.Result.ExitCode != 0 || last.Result.OutputBytes != bigOutput+int64(len(bigTail)) {
		t.Errorf("last event: got %s %+v, want EXIT 0 with output_bytes %d", last.Kind, last.Result, bigOutput+len(bigTail))
	}
}

// TestExecOfASandboxThatDiesIsSandboxFailed: a synchronous exec whose sandbox dies under it
// answers SANDBOX_FAILED with the sandbox's reason, the sandbox is FAILED, and the exec's
// stream still ends with an exit event carrying the error.
func TestExecOfASandboxThatDiesIsSandboxFailed(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	done := execInBackground(e, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "echo started; sleep 60"}})
	g, err := e.Svc.Guest(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		infos, err := g.Execs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 1 && infos[0].Running && infos[0].LogBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command did not start: %+v", infos)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := e.Fake.Kill(sb.ID, "out of memory"); err != nil {
		t.Fatal(err)
	}
	a := awaitAnswer(t, done, 30*time.Second)
	ae := apierror.From(a.err)
	if ae.Code != apierror.SandboxFailed || !strings.Contains(ae.Message, "out of memory") {
		t.Fatalf("exec: got %+v %v, want SANDBOX_FAILED naming the reason", a.res, a.err)
	}
	execID, _ := ae.Details["exec_id"].(string)
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || got.State != sandbox.Failed || !strings.Contains(got.StateReason, "out of memory") {
		t.Fatalf("sandbox: got %s %q %v, want FAILED with the reason", got.State, got.StateReason, err)
	}
	ch, err := e.Svc.ExecOutput(ctx, alice, execID, "")
	if err != nil {
		t.Fatalf("the exec's output (%q): %v", execID, err)
	}
	stdout, _, evs := domaintest.Collect(t, ch)
	last := evs[len(evs)-1]
	if string(stdout) != "started\n" || last.Kind != sandbox.ExecExit || !strings.Contains(last.Result.Error, "out of memory") {
		t.Fatalf("output: got %q, last %s %+v; want the output and an exit naming the reason", stdout, last.Kind, last.Result)
	}
}

func tail(b []byte) string {
	return string(b[max(0, len(b)-16):])
}

// TestCorruptLogIsNotReadInATightLoop: a command that garbles its own log's file (it runs as
// root in its sandbox, where the state folder is within reach) makes every reopen of the log
// meet the same corrupt record. The replica that follows it reopens the log after growing
// pauses, not in a tight loop of round trips into the sandbox; the exec still ends when its
// sandbox stops.
func TestCorruptLogIsNotReadInATightLoop(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	first, second := e.Replica(t), e.Replica(t)
	// The first record's header becomes kind 9 with a payload of 4 GiB.
	script := `sleep 0.3; head -c 100000 /dev/zero | tr '\000' y; ` +
		`printf '\011\377\377\377\377' | dd of="$(ls ../execs-*/"$` + proto.ExecIDEnv + `".log.0)" conv=notrunc 2>/dev/null; ` +
		`touch corrupted; sleep 60`
	res, err := first.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", script}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	first.Close() // nobody follows while the command writes and garbles
	g, err := second.Guest(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if out, err := g.Run(ctx, proto.ExecRequest{ID: "probe-" + strconv.FormatInt(time.Now().UnixNano(), 10), Argv: []string{"ls", "corrupted"}}, 0, 0); err == nil && out.Exit.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not garble its log")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := second.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	const watch = 3 * time.Second
	time.Sleep(watch)
	// Pauses of 0.1, 0.2, 0.3 s and on: seven reopens fit in 3 s, and a few more on a slow
	// machine's clock; a tight loop made hundreds.
	if n := execs.LogReopens(second.Execs); n < 2 || n > 12 {
		t.Errorf("the follower reopened the corrupt log %v times in %v, want a few", n, watch)
	}
	if _, err := second.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	ch, err := second.ExecOutput(ctx, alice, res.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	_, _, evs := domaintest.Collect(t, ch)
	if last := evs[len(evs)-1]; last.Kind != sandbox.ExecExit || last.Result == nil || last.Result.Error == "" {
		t.Errorf("last event after the stop: %+v, want EXIT with the error that ended it", last)
	}
}
