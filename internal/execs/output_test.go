package execs_test

import (
	"bytes"
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	"sandboxd/internal/execs"
	"sandboxd/internal/execstream"
	"sandboxd/internal/redistest"
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

// TestExecOutputReadsTheStatusOnce: a subscription to an exec's output checks the exec, reads
// its status and its first output in one round trip to Redis, and its exit event takes no
// read of the status after it (the exit entry carries what the status adds); the event's
// result is what GetExec answers. So for an exec that ended before, the whole replay is one
// round trip, and so is GetExec with its output. Another tenant learns nothing, whatever
// cursor it sends.
func TestExecOutputReadsTheStatusOnce(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{RealRedis: true})
	trips := redistest.CountKeyTrips(e.Redis.Client, "")
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)

	// lastOf follows an exec's output to its end and returns the exit event.
	lastOf := func(ch <-chan sandbox.ExecEvent) sandbox.ExecEvent {
		t.Helper()
		var last sandbox.ExecEvent
		for ev := range ch {
			last = ev
		}
		if last.Kind != sandbox.ExecExit || last.Result == nil {
			t.Fatalf("the output ended with %s, want EXIT with a result", last.Kind)
		}
		return last
	}
	// same fails unless an exit event's result is the exec's status as GetExec answers it.
	same := func(step string, got *sandbox.ExecResult, execID string) {
		t.Helper()
		want, err := e.Svc.GetExec(ctx, alice, "", execID, false)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("%s: the exit event's result\n got %+v\nwant %+v (GetExec)", step, *got, want)
		}
	}

	ended, err := e.Svc.Exec(ctx, alice, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	trips.Watch("{" + ended.ExecID + "}")
	ch, err := e.Svc.ExecOutput(ctx, alice, ended.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	last := lastOf(ch)
	if n := trips.Trips(); n != 1 {
		t.Errorf("the replay of an ended exec took %d round trips to Redis, want 1", n)
	}
	if last.Result.ExitCode != 3 || last.Result.OutputBytes != 8 || last.Result.EndedAt.IsZero() {
		t.Errorf("the exit event's result: got %+v, want exit 3, 8 bytes, an end time", *last.Result)
	}
	same("ended before", last.Result, ended.ExecID)

	// The status with its output: one round trip too, for an exec this short.
	trips.Watch("{" + ended.ExecID + "}")
	st, err := e.Svc.GetExec(ctx, alice, sb.ID, ended.ExecID, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.Trips(); n != 1 {
		t.Errorf("the status with output took %d round trips to Redis, want 1", n)
	}
	if string(st.Stdout) != "out\n" || string(st.Stderr) != "err\n" || st.ExitCode != 3 {
		t.Errorf("the status with output: got %q / %q, exit %d; want out, err, exit 3", st.Stdout, st.Stderr, st.ExitCode)
	}
	for name, c := range map[string]struct {
		p   auth.Principal
		sbx string
	}{"another-tenant": {bob, ""}, "another-sandbox": {alice, "sbx_01NOSUCHSANDBOX0000000000"}} {
		if _, err := e.Svc.GetExec(ctx, c.p, c.sbx, ended.ExecID, true); apierror.CodeOf(err) != apierror.NotFound {
			t.Errorf("%s: the status with output: got %v, want NOT_FOUND", name, err)
		}
	}

	running := detach(t, e, sb.ID, sandbox.ExecRequest{Command: []string{"sh", "-c", "echo one; sleep 0.5; echo two"}})
	trips.Watch("{" + running.ExecID + "}")
	ch, err = e.Svc.ExecOutput(ctx, alice, running.ExecID, "")
	if err != nil {
		t.Fatal(err)
	}
	last = lastOf(ch)
	if last.Result.OutputBytes != 8 {
		t.Errorf("the exit event's result: got %+v, want 8 bytes", *last.Result)
	}
	if reads := trips.Commands("hgetall"); reads != 1 {
		t.Errorf("following an exec to its end read its whole status %d times, want once (with the first output)", reads)
	}
	same("ended under the subscription", last.Result, running.ExecID)

	for _, cursor := range []string{"", "0-0", "not-a-cursor", "99-1"} {
		if _, err := e.Svc.ExecOutput(ctx, bob, ended.ExecID, cursor); apierror.CodeOf(err) != apierror.NotFound {
			t.Errorf("another tenant's subscription after %q: got %v, want NOT_FOUND", cursor, err)
		}
	}
	if _, err := e.Svc.ExecOutput(ctx, alice, ended.ExecID, "not-a-cursor"); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Errorf("the owner's subscription after a malformed cursor: got %v, want INVALID_ARGUMENT", err)
	}
	if _, err := e.Svc.ExecOutput(ctx, alice, "exec_01NOSUCHEXEC0000000000000", ""); apierror.CodeOf(err) != apierror.NotFound {
		t.Errorf("an unknown exec: got %v, want NOT_FOUND", err)
	}
}
