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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"sandboxd/guest"
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
	t.Run("ExecTimeoutKillsTree", func(t *testing.T) {
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		// A duration no other process uses marks this exec's sleeps (the Fake's run on the host).
		dur := fmt.Sprintf("%d.%06d", 60, rand.IntN(1000000))
		start := time.Now()
		res := MustRun(t, c, guest.ExecRequest{
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
		res = MustRun(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "ps -eo args= | grep -c '^sleep " + dur + "$'"}})
		if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
			t.Errorf("got %q sleep processes left after the timeout (stderr %q), want 0", got, res.Stderr)
		}
	})
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, d, spec, !cfg.skipHost) })
	t.Run("NetworkNone", func(t *testing.T) {
		if cfg.skipHost {
			t.Skip("the driver's boxes share the host network (SkipHostIsolation)")
		}
		id := CreateBox(t, d, spec)
		c := Client(t, d, id)
		res := MustRun(t, c, guest.ExecRequest{Argv: []string{"cat", "/proc/net/dev"}})
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
		res := MustRun(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "echo hi > f && pwd"}})
		if res.Exit.ExitCode != 0 {
			t.Fatalf("got exit %+v, stderr %q, want 0", res.Exit, res.Stderr)
		}
	})
	step("SecondAttachSeesFile", func(t *testing.T) {
		c := Client(t, d, id)
		res := MustRun(t, c, guest.ExecRequest{Argv: []string{"cat", "f"}})
		if got := string(res.Stdout); got != "hi\n" || res.Exit.ExitCode != 0 {
			t.Errorf("got %q (exit %+v), want %q", got, res.Exit, "hi\n")
		}
		res = MustRun(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 42"}})
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
		res := MustRun(t, c, guest.ExecRequest{Argv: []string{"cat", "f"}})
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
	res := MustRun(t, c1, guest.ExecRequest{Argv: []string{"sh", "-c", "ls -A | wc -l"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
		t.Errorf("a new box's workspace has %s entries, want 0", got)
	}
	write, list := "echo secret > only-here", "ls -A"
	if ownTmp {
		write, list = write+" && touch /tmp/only-here", list+"; ls /tmp"
	}
	MustRun(t, c0, guest.ExecRequest{Argv: []string{"sh", "-c", write}})
	res = MustRun(t, c1, guest.ExecRequest{Argv: []string{"sh", "-c", list}})
	if strings.Contains(string(res.Stdout), "only-here") {
		t.Errorf("box %s sees the other box's file: %q", ids[1], res.Stdout)
	}
	res = MustRun(t, c0, guest.ExecRequest{Argv: []string{"cat", "only-here"}})
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
	MustRun(t, c1, guest.ExecRequest{Argv: []string{"true"}})
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
func Client(t testing.TB, d runtime.Driver, id string) *guest.Client {
	t.Helper()
	rwc, err := d.Attach(ctxT(t), id)
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	c, err := guest.DialContext(ctxT(t), rwc) // owns rwc from here
	if err != nil {
		t.Fatalf("guest.Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// MustRun runs req (with a fresh id when it has none) and fails the test when the call fails.
func MustRun(t testing.TB, c *guest.Client, req guest.ExecRequest) guest.RunResult {
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
