package kube_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"sandboxd/guest/proto"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

var spec = runtime.BoxSpec{Profile: "test", Image: kubetest.BaseImage, MilliCPU: 1000, MemoryBytes: 512 << 20, DiskBytes: 1 << 30, Network: "none"}

func newDriver(t testing.TB, cfg *rest.Config, mod ...func(*kube.Options)) *kube.Driver {
	t.Helper()
	opts := kube.Options{Config: cfg, InitImage: kubetest.InitImage, ReadyTimeout: time.Minute}
	for _, m := range mod {
		m(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := kube.New(ctx, opts)
	if err != nil {
		t.Fatalf("kube.New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return d
}

// TestConformance runs the runtime conformance suite on real pods: the driver runs as
// deploy/base's ServiceAccount, so a verb its Role lacks fails here.
func TestConformance(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return newDriver(t, cfg) }, spec)
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestPodDeletedBehindOurBack: a pod deleted by someone else is reported failed with a reason,
// and a start brings the box back on the same workspace.
func TestPodDeletedBehindOurBack(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, spec)
	cl := runtimetest.Client(t, d, id)
	runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"sh", "-c", "echo kept > f"}})
	name, _ := kube.ObjectName(id)
	zero := int64(0)
	if err := c.Clientset(t).CoreV1().Pods(kubetest.Namespace).Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	var b runtime.Box
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if b, err = d.Get(ctx(t), id); err != nil {
			t.Fatal(err)
		}
		if b.Phase == runtime.PhaseFailed || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b.Phase != runtime.PhaseFailed || !strings.Contains(b.Reason, "pod") {
		t.Fatalf("after the pod was deleted: phase %s (%q), want failed naming the pod", b.Phase, b.Reason)
	}
	if _, err := d.Attach(ctx(t), id); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("Attach to a box without its pod: got %v, want ErrNotRunning", err)
	}
	if fresh, err := d.Start(ctx(t), id); err != nil || fresh {
		t.Fatalf("Start: (%v, %v), want (false, nil)", fresh, err)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"cat", "f"}})
	if string(res.Stdout) != "kept\n" {
		t.Errorf("after the restart got %q, want the workspace kept", res.Stdout)
	}
}

// TestNewDriverFindsBoxes: a second driver (a restarted control plane) lists the boxes and
// their records from the cluster alone, and attaches to them.
func TestNewDriverFindsBoxes(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d1 := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d1, spec)
	if _, err := d1.UpdateRecord(ctx(t), id, func(r *runtime.Record) error { r.State = "RUNNING"; r.LatestCheckpoint = "ckpt_9"; return nil }); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, cfg)
	boxes, err := d2.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var found *runtime.Box
	for i := range boxes {
		if boxes[i].Record.ID == id {
			found = &boxes[i]
		}
	}
	if found == nil || found.Phase != runtime.PhaseRunning || found.Record.LatestCheckpoint != "ckpt_9" || found.Record.Tenant != "tenant-a" {
		t.Fatalf("the new driver lists %+v, want the running box with its record", found)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d2, id), proto.ExecRequest{Argv: []string{"true"}})
	if res.Exit.ExitCode != 0 {
		t.Errorf("exec through the new driver: %+v", res.Exit)
	}
}

// TestCannotRun: a pod the cluster cannot schedule and an image the node cannot run fail the
// create with the reason, and leave nothing behind.
func TestCannotRun(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg, func(o *kube.Options) { o.UnschedulableTimeout = 2 * time.Second })
	for name, tc := range map[string]struct {
		spec runtime.BoxSpec
		want string
	}{
		"unschedulable": {runtime.BoxSpec{Profile: "huge", Image: kubetest.BaseImage, MilliCPU: 1000, MemoryBytes: 4 << 40}, "cannot be scheduled"},
		"unknown image": {runtime.BoxSpec{Profile: "bad", Image: "sandboxd/no-such-image:1", MilliCPU: 1000, MemoryBytes: 256 << 20}, `cannot run image "sandboxd/no-such-image:1"`},
	} {
		t.Run(name, func(t *testing.T) {
			rec := runtimetest.NewRecord(tc.spec)
			start := time.Now()
			err := d.Create(ctx(t), rec)
			var se *runtime.StartError
			if !errors.As(err, &se) || !strings.Contains(se.Reason, tc.want) {
				t.Fatalf("Create: got %v, want a StartError containing %q", err, tc.want)
			}
			t.Logf("failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if _, err := d.Get(ctx(t), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("Get after a failed create: %v, want ErrNotFound", err)
			}
			name, _ := kube.ObjectName(rec.ID)
			pods, err := c.Clientset(t).CoreV1().Pods(kubetest.Namespace).List(ctx(t), metav1.ListOptions{LabelSelector: kube.LabelSandboxID + "=" + rec.ID})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					t.Errorf("pod %s (%s) left behind", p.Name, name)
				}
			}
		})
	}
}

// TestStartCannotRun: a start whose pod cannot run fails with the reason and leaves the box
// stopped (no pod, workspace kept), so a later start can succeed.
func TestStartCannotRun(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, spec)
	runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "echo kept > f"}})
	if err := d.Stop(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	setImage := func(image string) {
		t.Helper()
		if _, err := d.UpdateRecord(ctx(t), id, func(r *runtime.Record) error { r.Spec.Image = image; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	setImage("sandboxd/no-such-image:2")
	_, err := d.Start(ctx(t), id)
	var se *runtime.StartError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "sandboxd/no-such-image:2") {
		t.Fatalf("Start: got %v, want a StartError naming the image", err)
	}
	if b, err := d.Get(ctx(t), id); err != nil || b.Phase != runtime.PhaseStopped {
		t.Fatalf("after a failed start: %+v %v, want stopped", b, err)
	}
	setImage(kubetest.BaseImage)
	if _, err := d.Start(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"cat", "f"}})
	if string(res.Stdout) != "kept\n" {
		t.Errorf("after the start got %q, want the workspace kept", res.Stdout)
	}
}
