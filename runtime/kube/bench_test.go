package kube_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	watchtools "k8s.io/client-go/tools/watch"

	"sandboxd/guest/proto"
	"sandboxd/internal/benchws"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// The benchmarks measure, side by side on the same cluster: a command through the guest init
// over an existing attach against a bare pod exec (what `kubectl exec` does: one remotecommand
// stream through the API server per command), and the driver's create-to-first-exec (with the
// init container, or over an image that carries the init) against a bare PVC + pod (no init
// container) and one exec.

func BenchmarkBarePodExec(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	cs := kubernetes.NewForConfigOrDie(cfg)
	name := barePod(b, cs, "bench-exec")
	b.ResetTimer()
	for b.Loop() {
		bareExec(b, cfg, cs, name, "true")
	}
}

func BenchmarkAttachExec(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	d := newDriver(b, cfg)
	id := runtimetest.CreateBox(b, d, spec)
	cl := runtimetest.Client(b, d, id)
	b.ResetTimer()
	for b.Loop() {
		if res := runtimetest.MustRun(b, cl, proto.ExecRequest{Argv: []string{"true"}}); res.Exit.ExitCode != 0 {
			b.Fatalf("got exit %+v", res.Exit)
		}
	}
}

// BenchmarkAttachNew is one attach of a running box with no spare, as another replica's first
// call makes it: the pods/exec of the attach program, its ready byte and the handshake; through
// the connect program (C) and through the init's own connect (Go), side by side.
func BenchmarkAttachNew(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	d := newDriver(b, cfg)
	id := runtimetest.CreateBox(b, d, initSpec)
	ctx := benchCtx(b)
	attach := func(b *testing.B, d *kube.Driver) {
		rwc, err := d.Attach(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		rwc.Close()
		b.StartTimer()
	}
	attach(b, d) // the create's spare
	goConnect := newDriver(b, cfg)
	kube.UseInitConnect(goConnect)
	for _, v := range []struct {
		name string
		d    *kube.Driver
	}{{"connect=c", d}, {"connect=init", goConnect}} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				attach(b, v.d)
			}
		})
	}
}

// BenchmarkAttachHealth is the transport's floor: one request/response over an existing
// attach, no process started.
func BenchmarkAttachHealth(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	d := newDriver(b, cfg)
	id := runtimetest.CreateBox(b, d, spec)
	cl := runtimetest.Client(b, d, id)
	ctx := benchCtx(b)
	b.ResetTimer()
	for b.Loop() {
		if _, err := cl.Health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateToFirstExec(b *testing.B) { createToFirstExec(b, spec, false) }

// BenchmarkCreateToFirstExecImageHasInit is the same over an image that carries the guest init:
// no init container, the key brought by the first attach.
func BenchmarkCreateToFirstExecImageHasInit(b *testing.B) { createToFirstExec(b, initSpec, false) }

// BenchmarkCreateToFirstExecImageHasInitGoConnect is that with every attach through the init's
// own connect (a Go program) instead of the connect program (C): what the program saves.
func BenchmarkCreateToFirstExecImageHasInitGoConnect(b *testing.B) {
	createToFirstExec(b, initSpec, true)
}

// BenchmarkCreateToFirstExecEgress is the same with an egress policy: the sandbox's
// NetworkPolicy, written before the pod either way, carries ipBlocks and the DNS rule instead of
// no rule. (The test node enforces no policy: this is the control plane's cost alone.)
func BenchmarkCreateToFirstExecEgress(b *testing.B) { createToFirstExec(b, egressSpec, false) }

func createToFirstExec(b *testing.B, spec runtime.BoxSpec, initConnect bool) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	d := newDriver(b, cfg)
	if initConnect {
		kube.UseInitConnect(d)
	}
	for b.Loop() {
		rec := runtimetest.NewRecord(spec)
		if err := d.Create(benchCtx(b), rec); err != nil {
			b.Fatal(err)
		}
		cl := runtimetest.Client(b, d, rec.ID)
		if res := runtimetest.MustRun(b, cl, proto.ExecRequest{Argv: []string{"true"}}); res.Exit.ExitCode != 0 {
			b.Fatalf("got exit %+v", res.Exit)
		}
		b.StopTimer()
		cl.Close()
		if err := d.Delete(benchCtx(b), rec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkBarePodToFirstExec(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	cs := kubernetes.NewForConfigOrDie(cfg)
	i := 0
	for b.Loop() {
		i++
		name := barePod(b, cs, fmt.Sprintf("bench-create-%d-%d", time.Now().UnixNano()%1e6, i))
		bareExec(b, cfg, cs, name, "true")
	}
}

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

// barePod creates a PVC and a pod that sleeps over the base image, waits for it to run, and
// deletes both when the benchmark ends.
func barePod(b *testing.B, cs kubernetes.Interface, name string) string {
	ctx := benchCtx(b)
	ns := kubetest.Namespace
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	runtimeClass, no, zero := "gvisor", false, int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RuntimeClassName:             &runtimeClass,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "main", Image: kubetest.BaseImage, Command: []string{"sleep", "infinity"},
				VolumeMounts: []corev1.VolumeMount{{Name: "w", MountPath: "/workspace"}}}},
			Volumes: []corev1.Volume{{Name: "w", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	b.Cleanup(func() {
		ctx := context.Background()
		_ = cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: created.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	_, err = watchtools.UntilWithoutRetry(ctx, w, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && p.UID == created.UID && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		b.Fatalf("pod %s did not run: %v", name, err)
	}
	return name
}

// bareExec runs argv in the pod through the API server, as `kubectl exec` does.
func bareExec(b *testing.B, cfg *rest.Config, cs kubernetes.Interface, pod string, argv ...string) {
	req := cs.CoreV1().RESTClient().Post().Namespace(kubetest.Namespace).Resource("pods").Name(pod).
		SubResource("exec").VersionedParams(&corev1.PodExecOptions{Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, req.URL().String())
	if err != nil {
		b.Fatal(err)
	}
	var out bytes.Buffer
	if err := ex.StreamWithContext(benchCtx(b), remotecommand.StreamOptions{Stdout: &out, Stderr: &out}); err != nil {
		b.Fatalf("exec %v: %v (%s)", argv, err, out.String())
	}
}

// BenchmarkNetworkPolicyWrite is what a create adds for its sandbox's NetworkPolicy: one
// create of the egress policy through the API server (deleted again off the clock).
func BenchmarkNetworkPolicyWrite(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 200, 400 // the driver's (client-go's default of 5/s would be the measure)
	cs := kubernetes.NewForConfigOrDie(cfg)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{UID: "00000000-0000-0000-0000-000000000002"}}
	for b.Loop() {
		rec := runtimetest.NewRecord(egressSpec)
		pvc.Name, _ = kube.ObjectName(rec.ID)
		np := kube.RenderNetworkPolicy(kubetest.Namespace, rec, pvc)
		if _, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Create(benchCtx(b), np, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// (The garbage collector may have deleted it already: its owner does not exist.)
		if err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Delete(benchCtx(b), np.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkWorkspaceExport reads one box's 100 MB, 6,000-file workspace as tar, three ways,
// side by side on the same box: through the guest init over the driver's attach (what a kube
// stop's checkpoint reads), a bare pods/exec of `tar -c` with its stdout through the API
// server, `tar -c` piped into `wc -c` inside the box (the walk and the reads, no stream), and
// `tar -c` into /dev/null inside the box (GNU tar then reads no file: the walk alone).
func BenchmarkWorkspaceExport(b *testing.B) {
	c := kubetest.Require(b)
	cfg, _ := c.Gateway(b)
	d := newDriver(b, cfg)
	sp := initSpec
	sp.DiskBytes, sp.MilliCPU = 2<<30, 2000
	id := runtimetest.CreateBox(b, d, sp)
	cl := runtimetest.Client(b, d, id)
	if res := runtimetest.MustRun(b, cl, proto.ExecRequest{Argv: append([]string{"python3", "-c", benchws.Script}, benchws.Args...)}); res.Exit.ExitCode != 0 {
		b.Fatalf("making the workspace: %+v %s", res.Exit, res.Stderr)
	}
	name, _ := kube.ObjectName(id)
	cs := kubernetes.NewForConfigOrDie(cfg)
	b.Run("guest-export", func(b *testing.B) {
		for b.Loop() {
			r, err := cl.ExportWorkspace(benchCtx(b))
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, r)
			r.Close()
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n)
		}
	})
	b.Run("bare-pods-exec-tar", func(b *testing.B) {
		for b.Loop() {
			req := cs.CoreV1().RESTClient().Post().Namespace(kubetest.Namespace).Resource("pods").Name(name).
				SubResource("exec").VersionedParams(&corev1.PodExecOptions{Container: "sandbox", Command: []string{"tar", "-cf", "-", "-C", "/workspace", "."},
				Stdout: true, Stderr: true}, scheme.ParameterCodec)
			ex, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, req.URL().String())
			if err != nil {
				b.Fatal(err)
			}
			cw := &countingWriter{}
			var stderr bytes.Buffer
			if err := ex.StreamWithContext(benchCtx(b), remotecommand.StreamOptions{Stdout: cw, Stderr: &stderr}); err != nil {
				b.Fatalf("tar: %v (%s)", err, stderr.String())
			}
			b.SetBytes(cw.n)
		}
	})
	b.Run("in-box-tar-read", func(b *testing.B) {
		for b.Loop() {
			if res := runtimetest.MustRun(b, cl, proto.ExecRequest{Argv: []string{"sh", "-c", "tar -cf - -C /workspace . | wc -c"}}); res.Exit.ExitCode != 0 {
				b.Fatalf("tar: %+v", res.Exit)
			}
		}
	})
	b.Run("in-box-tar-devnull", func(b *testing.B) {
		for b.Loop() {
			if res := runtimetest.MustRun(b, cl, proto.ExecRequest{Argv: []string{"tar", "-cf", "/dev/null", "-C", "/workspace", "."}}); res.Exit.ExitCode != 0 {
				b.Fatalf("tar: %+v", res.Exit)
			}
		}
	})
	// The stopped box's PVC read beside it by the workspace reader (a pod on the node's
	// native runtime): the whole read, and the reader's start alone (its first byte).
	if err := d.Stop(benchCtx(b), id); err != nil {
		b.Fatal(err)
	}
	rd := newDriver(b, cfg, func(o *kube.Options) {
		o.WorkspaceReader = kube.WorkspaceReader{Enabled: true, RuntimeClass: kubetest.NativeRuntimeClass}
	})
	b.Run("reader", func(b *testing.B) {
		for b.Loop() {
			r, err := rd.ExportStoppedWorkspace(benchCtx(b), id)
			if err != nil {
				b.Fatal(err)
			}
			zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, zr)
			zr.Close()
			r.Close()
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n)
		}
	})
	b.Run("reader-first-byte", func(b *testing.B) {
		for b.Loop() {
			r, err := rd.ExportStoppedWorkspace(benchCtx(b), id)
			if err != nil {
				b.Fatal(err)
			}
			_, err = io.ReadFull(r, make([]byte, 1))
			r.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }
