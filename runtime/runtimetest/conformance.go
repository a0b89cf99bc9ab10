// Package runtimetest holds what every runtime.Driver is tested with: Run, a conformance suite
// any driver must pass, and Fake, an in-memory driver for the domain's unit tests whose boxes
// run real commands on the host through an in-process guest server.
package runtimetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// NewID returns a fresh box id in the project's format: "sbx_" and a 26-character ULID.
func NewID() string { return "sbx_" + ulid.Make().String() }

// NewExecID returns a fresh exec id ("exec_" and a ULID).
func NewExecID() string { return "exec_" + ulid.Make().String() }

// Option adjusts Run.
type Option func(*config)

type config struct {
	skipHost bool
}

// SkipHostIsolation skips the assertions that need a box isolated from the host: its own /tmp
// and only its own loopback network. A driver whose boxes run on the host (Fake) cannot meet
// them.
func SkipHostIsolation() Option { return func(c *config) { c.skipHost = true } }

// opTimeout bounds each driver call of the suite.
const opTimeout = 60 * time.Second

// Run is the conformance suite. newDriver is called once; every box the suite creates from
// spec is deleted when it ends. Commands use paths relative to their working directory,
// which is the workspace for every driver.
func Run(t *testing.T, newDriver func(t *testing.T) runtime.Driver, spec runtime.BoxSpec, opts ...Option) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	d := newDriver(t)

	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, d, spec) })
	t.Run("UnknownBox", func(t *testing.T) { testUnknown(t, d) })
	t.Run("Fencing", func(t *testing.T) { testFencing(t, d, spec) })
	t.Run("ExecTimeoutKillsTree", func(t *testing.T) {
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		// A duration no other process uses marks this exec's sleeps (the Fake's run on the host).
		dur := fmt.Sprintf("%d.%06d", 60, rand.IntN(1000000))
		start := time.Now()
		res := MustRun(t, c, proto.ExecRequest{
			Argv:      []string{"sh", "-c", "sleep " + dur + " & sleep " + dur + " & sleep " + dur + "; wait"},
			TimeoutMs: 500,
		})
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("timed-out exec took %v, want about 0.5 s", el)
		}
		if !res.Exit.TimedOut {
			t.Errorf("got exit %+v, want timed_out", res.Exit)
		}
		// The whole tree is gone.
		res = MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "ps -eo args= | grep -c '^sleep " + dur + "$'"}})
		if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
			t.Errorf("got %q sleep processes left after the timeout (stderr %q), want 0", got, res.Stderr)
		}
	})
	// An exec's processes end with its timeout or signal whatever they do to their session,
	// process group or environment. With cgroup tracking (proto.TrackingCgroup) that is every
	// one of them; with process-group tracking it is what that promises (see the guest's
	// killTree), and the test logs what escaped it and ends that by pid.
	marked := func(t *testing.T, c *client.Client, ms []string) (pids []string, ps string) {
		t.Helper()
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"ps", "-eo", "pid=,args="}})
		for _, line := range strings.Split(string(res.Stdout), "\n") {
			// "pid sleep <marker>" (or "pid x <marker>" after exec -a): not the shells whose
			// scripts mention the markers
			if f := strings.Fields(line); len(f) == 3 && slices.Contains(ms, f[2]) {
				pids = append(pids, f[0])
			}
		}
		return pids, string(res.Stdout)
	}
	waitMarked := func(t *testing.T, c *client.Client, ms []string, want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, ps := marked(t, c, ms)
			if len(got) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("processes carrying %q: got %d (pids %v), want %d; ps:\n%s", ms, len(got), got, want, ps)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	markers := func(n int) []string {
		base := rand.IntN(900000) + 100000
		ms := make([]string, n)
		for i := range ms {
			ms[i] = fmt.Sprintf("%d.%06d", 1000+i, base)
		}
		return ms
	}
	tracking := func(t *testing.T, c *client.Client) bool {
		t.Helper()
		h, err := c.Health(ctxT(t))
		if err != nil {
			t.Fatalf("Health: %v", err)
		}
		t.Logf("process tracking: %q", h.ProcessTracking)
		return h.ProcessTracking == proto.TrackingCgroup
	}
	t.Run("ExecEscapesEnd", func(t *testing.T) {
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		cgroups := tracking(t, c)
		// caught: left the session and group but its parent is the exec's (m[0]); renamed,
		// in the group (m[1]); by cgroups only: forked twice, so re-parented to PID 1 (m[2]);
		// in a user namespace and mount namespace of its own, where it tries to mount the exec
		// hierarchy and move itself to its root (m[3]; without the seccomp filter of
		// server.Cgroups.Seal that works under gVisor).
		// (The mount is tried inside a box only: the fake's commands run on the host.)
		m := markers(4)
		script := fmt.Sprintf(`setsid env -i sleep %s &
nohup bash -c 'exec -a x sleep %s' >/dev/null 2>&1 &
(setsid env -i sleep %s &)
`, m[0], m[1], m[2])
		if cgroups {
			script += fmt.Sprintf(`unshare -Urm --propagation unchanged sh -c 'mkdir -p /tmp/cg-$$ && mount -t cgroup -o job cgroup /tmp/cg-$$ && echo $$ > /tmp/cg-$$/tasks; exec env -i sleep %s' >/dev/null 2>&1 &
`, m[3])
		} else {
			m = m[:3]
		}
		type result struct {
			res client.RunResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := c.Run(ctxT(t), proto.ExecRequest{ID: NewExecID(), Argv: []string{"bash", "-c", script + "sleep 600"}, TimeoutMs: 3000}, 1<<20, 1<<20)
			done <- result{res, err}
		}()
		var r result
		select {
		case r = <-done: // a failed start answers before the processes are counted
		case <-time.After(100 * time.Millisecond):
			waitMarked(t, c, m, len(m)) // every one of them runs before the timeout
			r = <-done
		}
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		if !r.res.Exit.TimedOut {
			t.Fatalf("got exit %+v (stdout %q, stderr %q), want timed_out", r.res.Exit, r.res.Stdout, r.res.Stderr)
		}
		if cgroups {
			waitMarked(t, c, m, 0)
			// PID 1 starts each command from a thread it moves into the exec's cgroup for the
			// fork; none of its threads may stay there (or be created there).
			res := MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", `for t in /proc/1/task/*; do grep -H ':job:' $t/cgroup; done`}})
			lines := strings.Fields(strings.TrimSpace(string(res.Stdout)))
			for _, l := range lines {
				if !strings.HasSuffix(l, ":job:/") {
					t.Errorf("a thread of PID 1 outside the root cgroup: %s", l)
				}
			}
			if len(lines) == 0 {
				t.Errorf("no thread of PID 1 listed (stderr %q)", res.Stderr)
			}
			return
		}
		waitMarked(t, c, m[:2], 0)
		if left, _ := marked(t, c, m); len(left) > 0 {
			t.Logf("process-group tracking: %d escaped process(es) (pids %v), as documented; ending them by pid", len(left), left)
			MustRun(t, c, proto.ExecRequest{Argv: append([]string{"kill", "-KILL"}, left...)})
		}
	})
	t.Run("SignalAfterExit", func(t *testing.T) {
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		cgroups := tracking(t, c)
		// A normal exit leaves what the command started in the background running (m[0], a
		// child of it that left the group m[1], and with cgroups a double-forked m[2]); a
		// signal sent to the ended exec still ends all of it.
		m := markers(3)
		script := fmt.Sprintf(`sleep %s &
sh -c 'setsid env -i sleep %s & wait' >/dev/null 2>&1 &
`, m[0], m[1])
		want := 2
		if cgroups {
			script += fmt.Sprintf("(setsid env -i sleep %s &)\n", m[2])
			want = 3
		}
		execID := NewExecID()
		res := MustRun(t, c, proto.ExecRequest{ID: execID, Argv: []string{"sh", "-c", script + "exit 0"}})
		if res.Exit.ExitCode != 0 || res.Exit.TimedOut {
			t.Fatalf("got exit %+v, want 0", res.Exit)
		}
		waitMarked(t, c, m, want)
		if err := c.Signal(ctxT(t), execID, "SIGKILL"); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		waitMarked(t, c, m, 0)
	})
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, d, spec, !cfg.skipHost) })
	t.Run("ChannelAttacks", func(t *testing.T) {
		if cfg.skipHost {
			t.Skip("the driver's boxes run their commands on the host (SkipHostIsolation)")
		}
		testChannel(t, d, spec)
	})
	t.Run("NetworkNone", func(t *testing.T) {
		if cfg.skipHost {
			t.Skip("the driver's boxes share the host network (SkipHostIsolation)")
		}
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"cat", "/proc/net/dev"}})
		var ifaces []string
		for _, line := range strings.Split(string(res.Stdout), "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
				ifaces = append(ifaces, strings.TrimSpace(name))
			}
		}
		if len(ifaces) != 1 || ifaces[0] != "lo" {
			t.Errorf("got interfaces %q, want only [lo]", ifaces)
		}
	})
}

func testLifecycle(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	rec := NewRecord(spec)
	id := rec.ID
	outer := t
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	step("Create", func(t *testing.T) {
		if err := d.Create(ctxT(t), rec); err != nil {
			t.Fatalf("Create: %v", err)
		}
		outer.Cleanup(func() { deleteBox(outer, d, id) })
	})
	step("GetRunning", func(t *testing.T) {
		b := mustGet(t, d, id)
		if b.Phase != runtime.PhaseRunning {
			t.Errorf("got phase %s (%s), want running", b.Phase, b.Reason)
		}
		if got, want := jsonOf(t, b.Record), jsonOf(t, rec); got != want {
			t.Errorf("got record %s, want %s", got, want)
		}
	})
	step("ListContains", func(t *testing.T) {
		boxes, err := d.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		found := false
		for _, b := range boxes {
			if b.Record.ID == id {
				found = true
				if b.Phase != runtime.PhaseRunning {
					t.Errorf("got listed phase %s, want running", b.Phase)
				}
			}
		}
		if !found {
			t.Errorf("List has no box %s", id)
		}
	})
	step("CreateTwice", func(t *testing.T) {
		if err := d.Create(ctxT(t), rec); !errors.Is(err, runtime.ErrExists) {
			t.Errorf("second Create: got %v, want ErrExists", err)
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseRunning {
			t.Errorf("after a refused Create: got phase %s, want running", b.Phase)
		}
	})
	step("AttachExec", func(t *testing.T) {
		c := Client(t, d, id)
		if _, err := c.Health(ctxT(t)); err != nil {
			t.Fatalf("Health: %v", err)
		}
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo hi > f && pwd"}})
		if res.Exit.ExitCode != 0 {
			t.Fatalf("got exit %+v, stderr %q, want 0", res.Exit, res.Stderr)
		}
	})
	step("SecondAttachSeesFile", func(t *testing.T) {
		c := Client(t, d, id)
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"cat", "f"}})
		if got := string(res.Stdout); got != "hi\n" || res.Exit.ExitCode != 0 {
			t.Errorf("got %q (exit %+v), want %q", got, res.Exit, "hi\n")
		}
		res = MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 42"}})
		if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.Exit.ExitCode != 42 {
			t.Errorf("got stdout %q stderr %q exit %d, want out, err, 42", res.Stdout, res.Stderr, res.Exit.ExitCode)
		}
	})
	step("UpdateRecord", func(t *testing.T) {
		got, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error {
			r.State = "RUNNING"
			r.LatestCheckpoint = "ckpt-1"
			if r.Annotations == nil {
				r.Annotations = map[string]string{}
			}
			r.Annotations["k"] = "v"
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateRecord: %v", err)
		}
		b := mustGet(t, d, id)
		if jsonOf(t, b.Record) != jsonOf(t, got) || got.State != "RUNNING" || got.Annotations["k"] != "v" || got.Tenant != rec.Tenant {
			t.Errorf("got stored %s, returned %s, want the update applied", jsonOf(t, b.Record), jsonOf(t, got))
		}
		boom := errors.New("boom")
		if _, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error { r.State = "X"; return boom }); !errors.Is(err, boom) {
			t.Errorf("got %v, want fn's error", err)
		}
		if b := mustGet(t, d, id); b.Record.State != "RUNNING" {
			t.Errorf("a failed update was stored: state %q", b.Record.State)
		}
	})
	step("ConcurrentUpdates", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Go(func() {
				_, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error {
					r.AutostopSec++
					return nil
				})
				if err != nil {
					t.Errorf("UpdateRecord: %v", err)
				}
			})
		}
		wg.Wait()
		if b := mustGet(t, d, id); b.Record.AutostopSec != rec.AutostopSec+8 {
			t.Errorf("got autostop %d after 8 increments, want %d", b.Record.AutostopSec, rec.AutostopSec+8)
		}
	})
	step("Stop", func(t *testing.T) {
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseStopped {
			t.Errorf("got phase %s (%s), want stopped", b.Phase, b.Reason)
		}
		if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
			t.Errorf("Attach to a stopped box: got %v, want ErrNotRunning", err)
		}
	})
	step("StopTwice", func(t *testing.T) {
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Errorf("second Stop: %v", err)
		}
	})
	step("StartKeepsWorkspace", func(t *testing.T) {
		fresh, err := d.Start(ctxT(t), id)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if fresh {
			t.Errorf("got fresh = true, want false (the workspace was kept)")
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseRunning {
			t.Errorf("got phase %s (%s), want running", b.Phase, b.Reason)
		}
		c := Client(t, d, id)
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"cat", "f"}})
		if string(res.Stdout) != "hi\n" {
			t.Errorf("after restart got %q, want %q", res.Stdout, "hi\n")
		}
	})
	step("StartRunning", func(t *testing.T) {
		fresh, err := d.Start(ctxT(t), id)
		if err != nil || fresh {
			t.Errorf("Start of a running box: got (%v, %v), want (false, nil)", fresh, err)
		}
	})
	step("Delete", func(t *testing.T) {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Get after Delete: got %v, want ErrNotFound", err)
		}
		boxes, err := d.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, b := range boxes {
			if b.Record.ID == id {
				t.Errorf("List still has %s", id)
			}
		}
	})
	step("DeleteTwice", func(t *testing.T) {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Errorf("second Delete: %v", err)
		}
	})
}

// testFencing: a write whose fence is lower than one the box has seen is refused with
// ErrFenced before it changes anything (UpdateRecord does not even call its fn); a higher one
// is recorded; the same one again is admitted (a lock holder makes many writes), and a write
// without a fence is not checked.
func testFencing(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	rec := NewRecord(spec)
	id := rec.ID
	// Fences as the operation locks hand them out: about the clock in microseconds.
	base := uint64(time.Now().UnixMicro())
	a, b, c := base, base+10, base+20
	with := func(t *testing.T, fence uint64) context.Context { return runtime.WithFence(ctxT(t), fence) }
	wantFence := func(t *testing.T, want uint64) runtime.Box {
		t.Helper()
		box := mustGet(t, d, id)
		if box.Fence != want {
			t.Fatalf("got box fence %d, want %d", box.Fence, want)
		}
		return box
	}
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, runtime.ErrFenced) {
			t.Fatalf("%s with an older fence: got %v, want ErrFenced", what, err)
		}
	}
	unchanged := func(t *testing.T, before runtime.Box) {
		t.Helper()
		after := mustGet(t, d, id)
		if jsonOf(t, after) != jsonOf(t, before) {
			t.Fatalf("a refused write changed the box: got %s, want %s", jsonOf(t, after), jsonOf(t, before))
		}
	}
	if err := d.Create(with(t, a), rec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { deleteBox(t, d, id) })
	wantFence(t, a)
	// Holder B's first write raises the box's fence above holder A's.
	if _, err := d.UpdateRecord(with(t, b), id, func(r *runtime.Record) error { r.State = "RUNNING"; return nil }); err != nil {
		t.Fatalf("UpdateRecord with a newer fence: %v", err)
	}
	before := wantFence(t, b)
	if before.Phase != runtime.PhaseRunning || before.Record.State != "RUNNING" {
		t.Fatalf("got %s/%s, want a running box in RUNNING", before.Record.State, before.Phase)
	}
	// A, whose lock lapsed, writes on: every write is refused and changes nothing.
	called := false
	_, err := d.UpdateRecord(with(t, a), id, func(r *runtime.Record) error { called = true; r.State = "STOPPED"; return nil })
	refused(t, "UpdateRecord", err)
	if called {
		t.Errorf("a fenced-off UpdateRecord called its fn")
	}
	refused(t, "Stop", d.Stop(with(t, a), id))
	_, err = d.Start(with(t, a), id)
	refused(t, "Start", err)
	refused(t, "Delete", d.Delete(with(t, a), id))
	unchanged(t, before)
	MustRun(t, Client(t, d, id), proto.ExecRequest{Argv: []string{"true"}}) // still running
	// Without a fence nothing is checked and the fence stays.
	if _, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error { r.StateReason = "unfenced"; return nil }); err != nil {
		t.Fatalf("UpdateRecord without a fence: %v", err)
	}
	wantFence(t, b)
	// B's own writes go on with its fence.
	if err := d.Stop(with(t, b), id); err != nil {
		t.Fatalf("Stop with the box's fence: %v", err)
	}
	before = wantFence(t, b)
	if before.Phase != runtime.PhaseStopped {
		t.Fatalf("got phase %s (%s), want stopped", before.Phase, before.Reason)
	}
	_, err = d.Start(with(t, a), id)
	refused(t, "Start of a stopped box", err)
	unchanged(t, before)
	// A newer holder C starts it; B is the old one now.
	if _, err := d.Start(with(t, c), id); err != nil {
		t.Fatalf("Start with a newer fence: %v", err)
	}
	before = wantFence(t, c)
	if before.Phase != runtime.PhaseRunning {
		t.Fatalf("got phase %s (%s), want running", before.Phase, before.Reason)
	}
	refused(t, "Stop by the previous holder", d.Stop(with(t, b), id))
	unchanged(t, before)
	// Writers with fences above c race: the writes the box takes are in the order of their
	// fences (each checked and stored with its change in one step), and the highest wins.
	type write struct {
		pos   int64 // how many writes the record had counted before this one
		fence uint64
	}
	var (
		mu   sync.Mutex
		took []write
		wg   sync.WaitGroup
	)
	const writers = 12
	for _, i := range rand.Perm(writers) {
		fence := c + 1 + uint64(i)
		wg.Go(func() {
			var pos int64
			_, err := d.UpdateRecord(with(t, fence), id, func(r *runtime.Record) error {
				pos = r.TTLSec // the last call is the one stored
				r.TTLSec++
				return nil
			})
			if errors.Is(err, runtime.ErrFenced) {
				return
			}
			if err != nil {
				t.Errorf("UpdateRecord with fence %d: %v", fence, err)
				return
			}
			mu.Lock()
			took = append(took, write{pos, fence})
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("%d of %d racing writers' writes taken", len(took), writers)
	slices.SortFunc(took, func(x, y write) int { return int(x.pos - y.pos) })
	for i := 1; i < len(took); i++ {
		if took[i].pos == took[i-1].pos || took[i].fence < took[i-1].fence {
			t.Fatalf("writes taken, in order (record count, fence): %v; want distinct counts and rising fences", took)
		}
	}
	after := wantFence(t, c+writers)
	if len(took) == 0 || took[len(took)-1].fence != c+writers || after.Record.TTLSec != before.Record.TTLSec+int64(len(took)) {
		t.Fatalf("writes taken %v, ttl %d from %d: want the highest fence's last and every taken write counted", took, after.Record.TTLSec, before.Record.TTLSec)
	}
	if err := d.Delete(with(t, c+writers), id); err != nil {
		t.Fatalf("Delete with the box's fence: %v", err)
	}
	if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Get after Delete: got %v, want ErrNotFound", err)
	}
}

func testUnknown(t *testing.T, d runtime.Driver) {
	id := NewID()
	if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get: got %v, want ErrNotFound", err)
	}
	if _, err := d.Start(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Start: got %v, want ErrNotFound", err)
	}
	if err := d.Stop(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stop: got %v, want ErrNotFound", err)
	}
	if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Attach: got %v, want ErrNotFound", err)
	}
	if _, err := d.UpdateRecord(ctxT(t), id, func(*runtime.Record) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("UpdateRecord: got %v, want ErrNotFound", err)
	}
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete: got %v, want nil", err)
	}
}

func testIsolation(t *testing.T, d runtime.Driver, spec runtime.BoxSpec, ownTmp bool) {
	ids := make([]string, 2)
	var wg sync.WaitGroup
	for i := range ids {
		rec := NewRecord(spec)
		ids[i] = rec.ID
		wg.Go(func() {
			if err := d.Create(ctxT(t), rec); err != nil {
				t.Errorf("Create %s: %v", rec.ID, err)
				return
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		t.Cleanup(func() { deleteBox(t, d, id) })
	}
	if t.Failed() {
		t.FailNow()
	}
	c0, c1 := Client(t, d, ids[0]), Client(t, d, ids[1])
	// A new box's workspace is empty.
	res := MustRun(t, c1, proto.ExecRequest{Argv: []string{"sh", "-c", "ls -A | wc -l"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
		t.Errorf("a new box's workspace has %s entries, want 0", got)
	}
	write, list := "echo secret > only-here", "ls -A"
	if ownTmp {
		write, list = write+" && touch /tmp/only-here", list+"; ls /tmp"
	}
	MustRun(t, c0, proto.ExecRequest{Argv: []string{"sh", "-c", write}})
	res = MustRun(t, c1, proto.ExecRequest{Argv: []string{"sh", "-c", list}})
	if strings.Contains(string(res.Stdout), "only-here") {
		t.Errorf("box %s sees the other box's file: %q", ids[1], res.Stdout)
	}
	res = MustRun(t, c0, proto.ExecRequest{Argv: []string{"cat", "only-here"}})
	if string(res.Stdout) != "secret\n" {
		t.Errorf("got %q, want %q", res.Stdout, "secret\n")
	}
	// Stopping one leaves the other running.
	if err := d.Stop(ctxT(t), ids[0]); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if b := mustGet(t, d, ids[1]); b.Phase != runtime.PhaseRunning {
		t.Errorf("the other box is %s (%s), want running", b.Phase, b.Reason)
	}
	MustRun(t, c1, proto.ExecRequest{Argv: []string{"true"}})
}

// NewRecord returns a record with a fresh id for spec, as the domain would create it.
func NewRecord(spec runtime.BoxSpec) runtime.Record {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return runtime.Record{
		ID:             NewID(),
		Tenant:         "tenant-a",
		Project:        "project-a",
		Spec:           spec,
		State:          "CREATING",
		DesiredState:   "RUNNING",
		AutostopSec:    1800,
		TTLSec:         86400,
		CreatedAt:      now,
		StateChangedAt: now,
		Annotations:    map[string]string{"created-by": "runtimetest"},
	}
}

// CreateBox creates a box from spec and deletes it when the test ends.
func CreateBox(t testing.TB, d runtime.Driver, spec runtime.BoxSpec) string {
	t.Helper()
	rec := NewRecord(spec)
	if err := d.Create(ctxT(t), rec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { deleteBox(t, d, rec.ID) })
	return rec.ID
}

// Client attaches to a running box and returns a guest client over the attach; both are
// closed when the test ends.
func Client(t testing.TB, d runtime.Driver, id string) *client.Client {
	t.Helper()
	rwc, err := d.Attach(ctxT(t), id)
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	c, err := client.DialContext(ctxT(t), rwc) // owns rwc from here
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// MustRun runs req (with a fresh id when it has none) and fails the test when the call fails.
func MustRun(t testing.TB, c *client.Client, req proto.ExecRequest) client.RunResult {
	t.Helper()
	if req.ID == "" {
		req.ID = NewExecID()
	}
	res, err := c.Run(ctxT(t), req, 1<<20, 1<<20)
	if err != nil {
		t.Fatalf("Run %q: %v", req.Argv, err)
	}
	return res
}

func mustGet(t testing.TB, d runtime.Driver, id string) runtime.Box {
	t.Helper()
	b, err := d.Get(ctxT(t), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return b
}

func deleteBox(t testing.TB, d runtime.Driver, id string) {
	t.Helper()
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete %s: %v", id, err)
	}
}

// ctxT bounds one driver call of the suite. It does not derive from t.Context(), which ends
// before the test's cleanups (that delete boxes) run.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
