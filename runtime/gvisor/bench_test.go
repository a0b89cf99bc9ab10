package gvisor_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime/runtimetest"
)

// The benchmarks measure, side by side on the same machine: a command through the guest init
// over an existing attach against a bare `runsc exec`, and the driver's create-to-first-exec
// against raw runsc create + start + exec of a minimal bundle.

func BenchmarkBareRunscExec(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	flags, err := d.ContainerFlags(id)
	if err != nil {
		b.Fatal(err)
	}
	args := append(flags, "exec", id, "true")
	b.ResetTimer()
	for b.Loop() {
		if out, err := exec.Command(components.runsc, args...).CombinedOutput(); err != nil {
			b.Fatalf("runsc exec: %v: %s", err, out)
		}
	}
}

func BenchmarkAttachExec(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	c := runtimetest.Client(b, d, id)
	b.ResetTimer()
	for b.Loop() {
		res := runtimetest.MustRun(b, c, proto.ExecRequest{Argv: []string{"true"}})
		if res.Exit.ExitCode != 0 {
			b.Fatalf("got exit %+v", res.Exit)
		}
	}
}

// BenchmarkAttachExecStreamVsHTTP2 runs `true` over both transports of one box in turns, so
// that a noisy host slows both alike, and reports each one's median (ms) and their difference.
func BenchmarkAttachExecStreamVsHTTP2(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	h2 := runtimetest.Client(b, d, id)
	st := runtimetest.Client(b, d, id)
	st.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) { return d.AttachStream(ctx, id) })
	var ms [2][]float64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c := [2]*client.Client{h2, st}[i%2]
		t0 := time.Now()
		res := runtimetest.MustRun(b, c, proto.ExecRequest{Argv: []string{"true"}})
		ms[i%2] = append(ms[i%2], float64(time.Since(t0).Microseconds())/1000)
		if res.Exit.ExitCode != 0 {
			b.Fatalf("got exit %+v", res.Exit)
		}
	}
	if len(ms[1]) > 0 {
		m0, m1 := median(ms[0]), median(ms[1])
		b.ReportMetric(m0, "http2-ms")
		b.ReportMetric(m1, "stream-ms")
		b.ReportMetric(m0-m1, "saved-ms")
	}
}

// BenchmarkAttachExecAfterIdle is the pace of an agent: `true` over an exec stream after the
// box sat idle for a second and a half, next to two back-to-back ones (each op is all three).
// It reports both medians (ms): what a box's idle threads cost the first command.
func BenchmarkAttachExecAfterIdle(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	c := runtimetest.Client(b, d, id)
	c.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) { return d.AttachStream(ctx, id) })
	run := func() float64 {
		t0 := time.Now()
		res := runtimetest.MustRun(b, c, proto.ExecRequest{Argv: []string{"true"}})
		if res.Exit.ExitCode != 0 {
			b.Fatalf("got exit %+v", res.Exit)
		}
		return float64(time.Since(t0).Microseconds()) / 1000
	}
	run()
	var warm, idle []float64
	b.ResetTimer()
	for b.Loop() {
		warm = append(warm, run(), run())
		b.StopTimer()
		time.Sleep(1500 * time.Millisecond)
		b.StartTimer()
		idle = append(idle, run())
	}
	b.ReportMetric(median(warm), "warm-ms")
	b.ReportMetric(median(idle), "idle-ms")
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkAttachHealth is the transport's floor: one request/response over an existing
// attach, no process started.
func BenchmarkAttachHealth(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	c := runtimetest.Client(b, d, id)
	ctx := ctxT(b)
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateToFirstExec(b *testing.B) {
	d := newDriver(b)
	spec := defaultSpec()
	for i := 0; i < b.N; i++ {
		rec := runtimetest.NewRecord(spec)
		if err := d.Create(ctxT(b), rec); err != nil {
			b.Fatal(err)
		}
		rwc, err := d.Attach(ctxT(b), rec.ID)
		if err != nil {
			b.Fatal(err)
		}
		c, err := client.DialContext(ctxT(b), rwc)
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.Run(ctxT(b), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}}, 1<<10, 1<<10)
		if err != nil || res.Exit.ExitCode != 0 {
			b.Fatalf("Run: %v %+v", err, res.Exit)
		}
		b.StopTimer()
		c.Close()
		if err := d.Delete(ctxT(b), rec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkRawRunscCreateStartExec(b *testing.B) {
	need(b)
	dir, err := os.MkdirTemp("", "sbxraw")
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	bundle := filepath.Join(dir, "bundle")
	for _, p := range []string{root, bundle} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for syscall.Unmount(filepath.Join(root, "null-netns"), syscall.MNT_DETACH) == nil {
		}
		os.RemoveAll(dir)
	})
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"root":       map[string]any{"path": components.rootfs, "readonly": true},
		"process": map[string]any{
			"args": []string{"/bin/sleep", "infinity"}, "cwd": "/", "user": map[string]int{"uid": 0, "gid": 0},
			"env": []string{"PATH=/usr/bin:/bin"},
		},
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	js, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), js, 0o600); err != nil {
		b.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(dir, "runsc.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	flags := []string{"--root=" + root, "--platform=systrap", "--network=none"}
	run := func(logged bool, args ...string) {
		cmd := exec.Command(components.runsc, append(append([]string{}, flags...), args...)...)
		var out []byte
		var err error
		if logged { // create and start: the sandbox keeps their stdio open
			cmd.Stdout, cmd.Stderr = log, log
			err = cmd.Run()
		} else {
			out, err = cmd.CombinedOutput()
		}
		if err != nil {
			b.Fatalf("runsc %v: %v %s", args, err, out)
		}
	}
	for i := 0; i < b.N; i++ {
		id := runtimetest.NewID()
		run(true, "create", "--bundle="+bundle, id)
		run(true, "start", id)
		run(false, "exec", id, "true")
		b.StopTimer()
		run(false, "delete", "-force", id)
		b.StartTimer()
	}
}

// BenchmarkGet is what observing a running box costs (record, runsc state file, /proc).
func BenchmarkGet(b *testing.B) {
	d := newDriver(b)
	id := runtimetest.CreateBox(b, d, defaultSpec())
	ctx := ctxT(b)
	b.ResetTimer()
	for b.Loop() {
		if _, err := d.Get(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
