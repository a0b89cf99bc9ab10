// Package runtimetest holds what every runtime.Driver is tested with: Run, a conformance suite
// any driver must pass, and Fake, an in-memory driver for the domain's unit tests whose boxes
// run real commands on the host through an in-process guest server.
package runtimetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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
	t.Run("SignalEndedSparesTheNext", func(t *testing.T) {
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		cgroups := tracking(t, c)
		// An exec that ended with nothing left running gives its cgroup up, and the next exec
		// may run in it: a signal to the ended exec, and forgetting it, must not reach the
		// next one's processes, which its own signal still ends (with cgroups, a double-forked
		// one too).
		ended := NewExecID()
		MustRun(t, c, proto.ExecRequest{ID: ended, Argv: []string{"true"}})
		time.Sleep(100 * time.Millisecond) // the guest takes the cgroup back after the exit record
		m := markers(2)
		script := fmt.Sprintf("exec sleep %s\n", m[0])
		ms := m[:1]
		if cgroups {
			script = fmt.Sprintf("(setsid env -i sleep %s &)\n", m[1]) + script
			ms = m
		}
		running := NewExecID()
		if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: running, Argv: []string{"sh", "-c", script}}); err != nil {
			t.Fatalf("StartExec: %v", err)
		}
		waitMarked(t, c, ms, len(ms))
		if err := c.Signal(ctxT(t), ended, "SIGKILL"); err != nil {
			t.Fatalf("Signal of the ended exec: %v", err)
		}
		if err := c.Forget(ctxT(t), ended); err != nil {
			t.Fatalf("Forget of the ended exec: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		if got, ps := marked(t, c, ms); len(got) != len(ms) {
			t.Fatalf("after the ended exec's signal and forget, %d of the next exec's %d processes are left; ps:\n%s", len(got), len(ms), ps)
		}
		if err := c.Signal(ctxT(t), running, "SIGKILL"); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		waitMarked(t, c, ms, 0)
	})
	t.Run("Terminal", func(t *testing.T) { testTerminal(t, d, spec) })
	t.Run("StdinStream", func(t *testing.T) { testStdin(t, d, spec) })
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
