package kube_test

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/guest/proto"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// hostileTree is what a workload leaves in its workspace for the reader, which runs on the
// node's own kernel: links out of the workspace (to the node's secrets, up the tree), a FIFO
// (a read of it would block the walk), a hard link, a file no user may read, owned by
// another user, a name with a newline, 3 MiB of random bytes whose hash the box prints, and
// 32 MiB more, so that a read cut midway (below) cannot have ended before the cut.
const hostileTree = `set -e
mkdir -p d/e && printf hello > d/e/f
ln -s /etc/shadow shadow
ln -s ../../../../.. up
ln -s /proc/1/root root1
mkfifo fifo
ln d/e/f hard
printf secret > locked && chown 1234:1234 locked && chmod 000 locked
printf nl > "$(printf 'new\nline')"
head -c 3145728 /dev/urandom > big
head -c 33554432 /dev/urandom > pad
sha256sum big | cut -d' ' -f1`

// TestStoppedWorkspaceReader: a stopped box's workspace read beside it by a reader pod on the
// cluster's native runtime holds what the box wrote, links as links, nothing the links point
// to; the FIFO is left out and the walk does not block on it. A box that runs is refused, the
// reader pod goes with the stream, and a reader cut midway ends the tar with an error, never
// with io.EOF.
func TestStoppedWorkspaceReader(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg, func(o *kube.Options) {
		o.WorkspaceReader = kube.WorkspaceReader{Enabled: true, RuntimeClass: kubetest.NativeRuntimeClass}
	})
	id := runtimetest.CreateBox(t, d, spec)
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", hostileTree}})
	if res.Exit.ExitCode != 0 {
		t.Fatalf("making the tree: %+v %s", res.Exit, res.Stderr)
	}
	bigSum := strings.TrimSpace(string(res.Stdout))
	if _, err := d.ExportStoppedWorkspace(ctx(t), id); !errors.Is(err, runtime.ErrNotRunning) {
		t.Fatalf("reading a running box's volume: got %v, want ErrNotRunning (its pod is there)", err)
	}
	if err := d.Stop(ctx(t), id); err != nil {
		t.Fatal(err)
	}

	r, err := d.ExportStoppedWorkspace(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	// The stream is the reader's compressed tar, with a window the checkpoint store takes.
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	got := map[string]*tar.Header{}
	content := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the tar: %v", err)
		}
		got[strings.TrimSuffix(h.Name, "/")] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == "big" {
				s := sha256.Sum256(b)
				content[h.Name] = hex.EncodeToString(s[:])
			} else {
				content[h.Name] = string(b)
			}
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for name, link := range map[string]string{"shadow": "/etc/shadow", "up": "../../../../..", "root1": "/proc/1/root"} {
		if h := got[name]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != link {
			t.Errorf("%s: got %+v, want a symlink to %s (never followed)", name, h, link)
		}
	}
	want := map[string]string{"d/e/f": "hello", "hard": "hello", "locked": "secret", "new\nline": "nl", "big": bigSum}
	for name, v := range want {
		if content[name] != v {
			t.Errorf("%q: got %q, want %q", name, content[name], v)
		}
	}
	if h := got["locked"]; h == nil || h.Uid != 1234 || h.Mode&0o777 != 0 {
		t.Errorf("locked: got %+v, want uid 1234 and mode 000 kept", h)
	}
	if _, ok := got["fifo"]; ok {
		t.Error("the FIFO is in the tar; it must be left out")
	}
	name, _ := kube.ObjectName(id)
	cs := c.Clientset(t)
	waitGone := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name+"-reader", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reader pod is still there 30 s after its stream was closed (%v)", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitGone()

	// A reader cut midway (its pod deleted under it): whatever was read, the stream ends
	// with an error.
	r, err = d.ExportStoppedWorkspace(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	// The reader pod as it runs: the native runtime, the PVC read-only, root with one
	// capability on a read-only root, no token, and no label the box's NetworkPolicy selects.
	rp, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name+"-reader", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc := rp.Spec.Containers[0]
	if rp.Spec.RuntimeClassName == nil || *rp.Spec.RuntimeClassName != kubetest.NativeRuntimeClass ||
		rp.Spec.Volumes[0].PersistentVolumeClaim == nil || !rp.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly || !rc.VolumeMounts[0].ReadOnly ||
		rc.SecurityContext == nil || !*rc.SecurityContext.ReadOnlyRootFilesystem || *rc.SecurityContext.AllowPrivilegeEscalation ||
		len(rc.SecurityContext.Capabilities.Add) != 1 || *rp.Spec.AutomountServiceAccountToken ||
		rp.Labels[kube.LabelSandboxID] != "" || rp.Labels[kube.LabelReaderOf] != id {
		t.Errorf("the reader pod: %+v", rp.Spec)
	}
	zero := int64(0)
	if err := cs.CoreV1().Pods(kubetest.Namespace).Delete(ctx(t), name+"-reader", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, r); err == nil {
		t.Error("a reader whose pod was deleted midway ended its stream without an error")
	}
	r.Close()
	waitGone()

	// Delete removes a reader left behind (a replica that died while reading) with the box.
	r, err = d.ExportStoppedWorkspace(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	r.Close()
	waitGone()
}

// TestStoppedWorkspaceReaderCannotRun: a reader pod the cluster refuses (its runtime class
// does not exist) fails the read with the cluster's reason and leaves no pod.
func TestStoppedWorkspaceReaderCannotRun(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg, func(o *kube.Options) {
		o.WorkspaceReader = kube.WorkspaceReader{Enabled: true, RuntimeClass: "no-such-class"}
	})
	id := runtimetest.CreateBox(t, d, spec)
	if err := d.Stop(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	_, err := d.ExportStoppedWorkspace(ctx(t), id)
	if err == nil || !strings.Contains(err.Error(), "no-such-class") {
		t.Fatalf("got %v, want the cluster's refusal naming the runtime class", err)
	}
	name, _ := kube.ObjectName(id)
	if _, err := c.Clientset(t).CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name+"-reader", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused reader left a pod: %v", err)
	}
}

// TestStoppedWorkspaceReaderImageCannotRun: a reader pod whose image the node cannot run fails
// the read at once with the node's reason (not after ReadyTimeout, and not as a StartError,
// which would say the sandbox itself cannot run), and its pod goes.
func TestStoppedWorkspaceReaderImageCannotRun(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, spec)
	if err := d.Stop(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	broken := newDriver(t, cfg, func(o *kube.Options) {
		o.InitImage = "sandboxd/no-such-init:1"
		o.ReadyTimeout = 40 * time.Second
		o.WorkspaceReader = kube.WorkspaceReader{Enabled: true, RuntimeClass: kubetest.NativeRuntimeClass}
	})
	start := time.Now()
	rc, err := broken.ExportStoppedWorkspace(ctx(t), id)
	if err == nil {
		rc.Close()
		t.Fatal("a reader whose image cannot run read the workspace")
	}
	took := time.Since(start)
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
	if !strings.Contains(err.Error(), "no-such-init") || !strings.Contains(err.Error(), "workspace reader of "+id) {
		t.Errorf("got %v, want the reader's failure naming its image", err)
	}
	if errors.As(err, new(*runtime.StartError)) {
		t.Errorf("got a StartError (%v): the sandbox itself can run", err)
	}
	if took > 20*time.Second {
		t.Errorf("the read failed after %v: it waited for the timeout instead of the node's reason", took)
	}
	name, _ := kube.ObjectName(id)
	pods := c.Clientset(t).CoreV1().Pods(kubetest.Namespace)
	waitGone(t, func() error { _, err := pods.Get(ctx(t), name+"-reader", metav1.GetOptions{}); return err })
}
