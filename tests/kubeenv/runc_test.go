package kubeenv_test

// The node's second runtime: pods of RuntimeClass "runc" (handler runc, created by `kubeenv
// up`) run natively with Debian's runc, as the control plane's short-lived helper pod does
// when it reads a sandbox's PVC while the sandbox pod is gone. Same environment as
// TestKubeenv (KUBEENV_BIN, SANDBOXD_RUNSC, SANDBOXD_ROOTFS), plus runc (ensure-kubeenv.sh
// installs it).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// runcClass is the RuntimeClass `kubeenv up` creates with handler runc.
const runcClass = "runc"

func TestKubeenvRunc(t *testing.T) {
	bin, runscPath, rootfs := os.Getenv("KUBEENV_BIN"), os.Getenv("SANDBOXD_RUNSC"), os.Getenv("SANDBOXD_ROOTFS")
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal
	}
	if bin == "" || runscPath == "" || rootfs == "" {
		skip("set KUBEENV_BIN (scripts/ensure-kubeenv.sh), SANDBOXD_RUNSC (scripts/ensure-runsc.sh) and SANDBOXD_ROOTFS (scripts/ensure-rootfs.sh sandboxes-default) to run the runc pods check")
	}
	if os.Geteuid() != 0 {
		skip("runc and runsc need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	// The init image's shape (one static binary, no /proc, /dev, … folders), as the control
	// plane's reader pod runs it: a small static program stands for sandbox-init.
	initDir := filepath.Join(tmp, "init-image")
	buildStatic(t, initDir, "reader", staticReader)
	e := startCluster(ctx, t, tmp, bin, runscPath, rootfs, initDir)
	e.setup(ctx)
	rc, err := e.client.NodeV1().RuntimeClasses().Get(ctx, runcClass, metav1.GetOptions{})
	if err != nil || rc.Handler != "runc" {
		t.Fatalf("RuntimeClass %s made by kubeenv up: got %+v, %v; want handler runc", runcClass, rc, err)
	}

	// A gVisor pod writes the PVC, then goes.
	pvc := e.createPVC(ctx, "workspace")
	pvc = waitFor(ctx, t, e.client.CoreV1().PersistentVolumeClaims(namespace), pvc.Name, "PVC bound",
		func(c *corev1.PersistentVolumeClaim) (bool, error) { return c.Status.Phase == corev1.ClaimBound, nil })
	writer := simplePod("gvisor-writer", "gvisor", "sh", "-c", "echo hello > /data/a && head -c 1048576 /dev/urandom > /data/blob && mkdir /data/d")
	writer.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}}
	writer.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	p := e.runToEnd(ctx, writer)
	if p.Status.Phase != corev1.PodSucceeded || !strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "runsc://") {
		t.Fatalf("gVisor writer: phase %s, container id %q", p.Status.Phase, p.Status.ContainerStatuses[0].ContainerID)
	}
	e.deletePod(ctx, writer.Name)
	pvDir := filepath.Join(e.dir, "node", "pv", string(pvc.UID))
	blob, err := os.ReadFile(filepath.Join(pvDir, "blob"))
	if err != nil || len(blob) != 1<<20 {
		t.Fatalf("the gVisor pod's file on the PV: %d bytes, %v", len(blob), err)
	}

	// The helper: a runc pod with the PVC read-only, locked down as the control plane's.
	start := time.Now()
	reader := runcReader(pvc.Name)
	e.runPod(ctx, reader)
	t.Logf("timing: runc pod created → Running+Ready: %d ms", time.Since(start).Milliseconds())
	p, err = e.client.CoreV1().Pods(namespace).Get(ctx, reader.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id, ok := strings.CutPrefix(p.Status.ContainerStatuses[0].ContainerID, "runc://")
	if !ok {
		t.Fatalf("container id %q: want runc://…", p.Status.ContainerStatuses[0].ContainerID)
	}
	node := filepath.Join(e.dir, "node")
	if _, err := os.Stat(filepath.Join(runc.RootFor(node), id, "state.json")); err != nil {
		t.Fatalf("no runc state of container %s: %v", id, err)
	}
	if states, _ := filepath.Glob(filepath.Join(runsc.RootFor(node), "*.state")); len(states) > 0 {
		t.Fatalf("a runc pod made runsc containers: %v", states)
	}
	cgroup := filepath.Join(runsc.CgroupRoot, "memory", runc.CgroupParentFor(node), id)
	if b, err := os.ReadFile(filepath.Join(cgroup, "memory.limit_in_bytes")); err != nil || strings.TrimSpace(string(b)) != "268435456" {
		t.Fatalf("memory cgroup %s: limit %q, %v; want 268435456 (256Mi)", cgroup, b, err)
	}

	// Reads at host speed, what the gVisor pod wrote.
	sum := sha256.Sum256(blob)
	if out := e.exec(ctx, reader.Name, []string{"sh", "-c", "cat /data/a; sha256sum /data/blob"}, nil); out != "hello\n"+hex.EncodeToString(sum[:])+"  /data/blob\n" {
		t.Fatalf("reading the PVC: got %q", out)
	}
	// The PVC is read-only (EROFS), and so is the root; the emptyDir is writable.
	const tryWrite = `import errno, sys
for p in sys.argv[1:]:
    try:
        open(p, "w").close(); print(p, "ok")
    except OSError as e:
        print(p, errno.errorcode[e.errno])`
	want := "/data/x EROFS\n/data/d/x EROFS\n/etc/x EROFS\n/scratch/x ok\n/tmp/x ok\n"
	if out := e.exec(ctx, reader.Name, []string{"python3", "-c", tryWrite, "/data/x", "/data/d/x", "/etc/x", "/scratch/x", "/tmp/x"}, nil); out != want {
		t.Fatalf("writes: got %q, want %q", out, want)
	}
	if _, err := os.Stat(filepath.Join(pvDir, "x")); err == nil {
		t.Fatalf("a write of the runc pod reached the read-only PV")
	}
	// Network: only loopback. User, capabilities, no_new_privs, environment, working dir,
	// hostname, masked /proc/keys (a bind of /dev/null).
	checks := []struct{ cmd, want string }{
		{"ls /sys/class/net", "lo\n"},
		{"grep -c : /proc/net/dev", "1\n"}, // one interface line: lo
		{"id -u; id -g", "1000\n1000\n"},
		{"grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '", "CapEff: 0000000000000000\nCapBnd: 0000000000000400\nNoNewPrivs: 1\n"},
		{`echo "$FOO"; pwd; hostname`, "bar\n/data\nrunc-reader\n"},
		{"test -c /proc/keys && echo masked", "masked\n"},
	}
	for _, c := range checks {
		if out := e.exec(ctx, reader.Name, []string{"sh", "-c", c.cmd}, nil); out != c.want {
			t.Errorf("%s: got %q, want %q", c.cmd, out, c.want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Exec: exit codes, stdin, and 32 MiB of binary stdout intact and fast.
	err = e.execErr(ctx, reader.Name, []string{"sh", "-c", "echo oops >&2; exit 3"}, nil)
	var ce utilexec.CodeExitError
	if !errors.As(err, &ce) || ce.Code != 3 {
		t.Fatalf("exit 3: got %v (%T), want a CodeExitError with code 3", err, err)
	}
	if err := e.execErr(ctx, reader.Name, []string{"no-such-command"}, nil); err == nil {
		t.Fatalf("exec of a missing command succeeded")
	}
	in := make([]byte, 1<<20)
	_, _ = rand.Read(in)
	if out := e.exec(ctx, reader.Name, []string{"cat"}, bytes.NewReader(in)); out != string(in) {
		t.Fatalf("1 MiB through cat: got %d bytes back, equal=%v", len(out), out == string(in))
	}
	e.checkBigStdout(ctx, reader.Name)

	// A default delete: the container exits on SIGTERM, gone well before its 5 s grace.
	e.checkGracefulDelete(ctx)
	// Grace 0: nothing of the container is left (runc state, overlay mount, cgroup, folder).
	uid := e.podUID(ctx, reader.Name)
	start = time.Now()
	e.deletePod(ctx, reader.Name)
	t.Logf("timing: runc pod delete (grace 0) → gone: %d ms", time.Since(start).Milliseconds())
	e.waitRuncClean(ctx, uid, id)

	// A runc container of the one-binary image: it reads the PVC and exits 0.
	static := simplePod("runc-static", runcClass, "/reader", "/data/a")
	static.Spec.Containers[0].Image = initImage
	static.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: new(true)}
	static.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name, ReadOnly: true}}}}
	static.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}}
	if p = e.runToEnd(ctx, static); p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("runc pod of a one-binary image: phase %s, %+v", p.Status.Phase, p.Status.ContainerStatuses)
	}
	if logs, err := e.client.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx); err != nil || string(logs) != "hello\n" {
		t.Fatalf("logs of the one-binary pod: %q %v", logs, err)
	}
	if entries, _ := os.ReadDir(initDir); len(entries) != 1 {
		t.Fatalf("the runc container wrote into the image folder: %v", entries)
	}
	e.deletePod(ctx, p.Name)

	// Exit codes: a runc container that exits 7 fails the pod with its terminated state.
	p = e.runToEnd(ctx, simplePod("runc-exits-7", runcClass, "sh", "-c", "echo bye; exit 7"))
	term := p.Status.ContainerStatuses[0].State.Terminated
	if p.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 7 || term.Reason != "Error" || !strings.HasPrefix(term.ContainerID, "runc://") {
		t.Fatalf("runc container exiting 7: phase %s, state %+v", p.Status.Phase, p.Status.ContainerStatuses[0].State)
	}
	if logs, err := e.client.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx); err != nil || string(logs) != "bye\n" {
		t.Fatalf("logs: %q %v", logs, err)
	}
	e.deletePod(ctx, p.Name)
	if p = e.runToEnd(ctx, simplePod("runc-exits-0", runcClass, "true")); p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("runc container exiting 0: phase %s", p.Status.Phase)
	}
	e.deletePod(ctx, p.Name)

	// A handler the node has no runtime for fails the pod, with the kubelet's reason.
	e.checkUnknownHandler(ctx)
	// A container whose shim was killed: its end is seen in `runc state`.
	e.checkShimKilled(ctx)

	// A runc pod still running when the cluster stops: the node's shutdown removes it.
	e.runPod(ctx, simplePod("runc-left", runcClass, "sleep", "3600"))
	e.stop(ctx)
	e.checkNoRunc()
}

// staticReader prints the files named by its arguments.
const staticReader = `package main

import "os"

func main() {
	for _, f := range os.Args[1:] {
		b, err := os.ReadFile(f)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.Write(b)
	}
}
`

// buildStatic builds a one-file Go program (CGO_ENABLED=0) as dir/name.
func buildStatic(t *testing.T, dir, name, src string) {
	t.Helper()
	srcDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(srcDir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "main.go")
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
}

// simplePod is a one-container pod of the base image named like the pod ("" class: none).
func simplePod(name, class string, cmd ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "sandbox", Image: baseImage, Command: cmd}},
		},
	}
	if class != "" {
		pod.Spec.RuntimeClassName = new(class)
	}
	return pod
}

// runcReader is the control plane's helper shape: runc, the claim read-only, an emptyDir,
// non-root, every capability dropped but one, no privilege escalation, a read-only root.
func runcReader(claim string) *corev1.Pod {
	pod := simplePod("runc-reader", runcClass, "sleep", "3600")
	pod.Spec.TerminationGracePeriodSeconds = new(int64(5))
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1000)), RunAsNonRoot: new(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	c := &pod.Spec.Containers[0]
	c.WorkingDir = "/data"
	c.Env = []corev1.EnvVar{{Name: "FOO", Value: "bar"}}
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_BIND_SERVICE"}},
	}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "scratch", MountPath: "/scratch"}}
	return pod
}

// runToEnd creates the pod and waits until it Succeeded or Failed.
func (e *env) runToEnd(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return waitFor(ctx, e.t, e.client.CoreV1().Pods(namespace), pod.Name, "pod "+pod.Name+" ended", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
}

// checkBigStdout streams 32 MiB of random bytes out of the container and compares their
// sha256 with the file's, computed in the container and on the host.
func (e *env) checkBigStdout(ctx context.Context, pod string) {
	t := e.t
	const size = 32 << 20
	out := e.exec(ctx, pod, []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /scratch/big && sha256sum /scratch/big", size)}, nil)
	inside, _, _ := strings.Cut(out, " ")
	h := sha256.New()
	n := &countWriter{w: h}
	var stderr bytes.Buffer
	start := time.Now()
	err := e.executor(e.request(pod, []string{"cat", "/scratch/big"}, false)).StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: n, Stderr: &stderr})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("cat 32 MiB: %v (stderr %q)", err, stderr.String())
	}
	got := hex.EncodeToString(h.Sum(nil))
	if n.n != size || got != inside {
		t.Fatalf("32 MiB of stdout: got %d bytes, sha256 %s; want %d bytes, sha256 %s", n.n, got, size, inside)
	}
	uid := e.podUID(ctx, pod)
	f, err := os.Open(filepath.Join(e.dir, "node", "pods", uid, "volumes", "scratch", "big"))
	if err != nil {
		t.Fatalf("the emptyDir's file on the host: %v", err)
	}
	defer f.Close()
	hh := sha256.New()
	_, _ = io.Copy(hh, f)
	if host := hex.EncodeToString(hh.Sum(nil)); host != inside {
		t.Fatalf("sha256 of the file on the host %s, in the container %s", host, inside)
	}
	t.Logf("timing: 32 MiB of stdout through exec from the runc container: %d ms (%.0f MB/s)", took.Milliseconds(), float64(size)/took.Seconds()/1e6)
}

type countWriter struct {
	w io.Writer
	n int
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += len(p)
	return c.w.Write(p)
}

// checkGracefulDelete deletes a runc pod with its grace period (5 s): its container exits
// on SIGTERM, and the pod is gone well before the grace period ends.
func (e *env) checkGracefulDelete(ctx context.Context) {
	t := e.t
	pod := simplePod("runc-graceful", runcClass, "sh", "-c", `trap "exit 0" TERM; sleep 3600 & wait`)
	pod.Spec.TerminationGracePeriodSeconds = new(int64(5))
	e.runPod(ctx, pod)
	p, err := e.client.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "runc://")
	start := time.Now()
	if err := e.client.CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	waitGone[*corev1.Pod](ctx, t, e.client.CoreV1().Pods(namespace), pod.Name)
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("a default delete of a runc pod took %s: the container should exit on SIGTERM", d)
	}
	t.Logf("timing: runc pod delete (default grace 5 s) → gone: %d ms", time.Since(start).Milliseconds())
	e.waitRuncClean(ctx, string(p.UID), id)
}

// waitRuncClean waits (briefly) until nothing of runc container id of pod uid is left: no
// runc state, no mount in the pod's folder, no cgroup, no pod folder.
func (e *env) waitRuncClean(ctx context.Context, uid, id string) {
	t := e.t
	node := filepath.Join(e.dir, "node")
	podDir := filepath.Join(node, "pods", uid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		if _, err := os.Stat(filepath.Join(runc.RootFor(node), id)); err == nil {
			left = append(left, "runc state")
		}
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), podDir) {
			left = append(left, "mounts in the pod folder")
		}
		cgroups, _ := filepath.Glob(filepath.Join(runsc.CgroupRoot, "*", runc.CgroupParentFor(node), id))
		left = append(left, cgroups...)
		if _, err := os.Stat(podDir); err == nil {
			left = append(left, "pod folder")
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the runc pod was deleted: left %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkUnknownHandler runs a pod whose RuntimeClass names a handler the node has no runtime
// for: the pod fails with reason FailedCreatePodSandBox and a message naming the handler.
func (e *env) checkUnknownHandler(ctx context.Context) {
	t := e.t
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "kata"}, Handler: "kata-fc"}
	if _, err := e.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create runtime class: %v", err)
	}
	p := e.runToEnd(ctx, simplePod("unknown-handler", "kata", "true"))
	if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "FailedCreatePodSandBox" || !strings.Contains(p.Status.Message, `"kata-fc"`) {
		t.Fatalf("pod of an unknown handler: phase %s, reason %q, message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	t.Logf("unknown handler: %s: %s", p.Status.Reason, p.Status.Message)
	e.deletePod(ctx, p.Name)
}

// checkShimKilled kills (by pid) the shim of a running runc container, then the container
// (runc kill): the node sees the end in runc's state and reports exit code 137.
func (e *env) checkShimKilled(ctx context.Context) {
	t := e.t
	e.runPod(ctx, simplePod("runc-orphan", runcClass, "sleep", "3600"))
	p, err := e.client.CoreV1().Pods(namespace).Get(ctx, "runc-orphan", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "runc://")
	shimPid := 0
	for _, proc := range processesUsing("--id=" + id) {
		pid, cmdline, _ := strings.Cut(proc, ": ")
		if strings.Contains(cmdline, " shim ") {
			shimPid, _ = strconv.Atoi(pid)
		}
	}
	if shimPid <= 0 {
		t.Fatalf("no shim process of container %s", id)
	}
	if err := syscall.Kill(shimPid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill shim pid %d: %v", shimPid, err)
	}
	time.Sleep(300 * time.Millisecond) // the node polls runc's state now: the container still runs
	if p, err := e.client.CoreV1().Pods(namespace).Get(ctx, "runc-orphan", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("after its shim was killed, the pod should still run: %v %v", p.Status.Phase, err)
	}
	node := filepath.Join(e.dir, "node")
	cli := &runc.CLI{Path: runc.DefaultPath, Root: runc.RootFor(node), CgroupParent: runc.CgroupParentFor(node)}
	if _, err := cli.Run(ctx, "kill", id, "KILL"); err != nil {
		t.Fatal(err)
	}
	p = waitFor(ctx, t, e.client.CoreV1().Pods(namespace), "runc-orphan", "pod Failed", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodFailed, nil
	})
	term := p.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 137 || !strings.Contains(term.Message, "shim was killed") {
		t.Fatalf("container state after its shim was killed: %+v", p.Status.ContainerStatuses[0].State)
	}
	e.deletePod(ctx, p.Name)
	e.waitRuncClean(ctx, string(p.UID), id)
}

// checkNoRunc checks, after the cluster stopped, that no runc container, cgroup or mount of
// the node is left.
func (e *env) checkNoRunc() {
	t := e.t
	node := filepath.Join(e.dir, "node")
	if ids, err := (&runc.CLI{Root: runc.RootFor(node)}).IDs(); err != nil || len(ids) > 0 {
		t.Fatalf("runc containers left after the cluster stopped: %v %v", ids, err)
	}
	if cgroups, _ := filepath.Glob(filepath.Join(runsc.CgroupRoot, "*", runc.CgroupParentFor(node))); len(cgroups) > 0 {
		t.Fatalf("runc cgroups left after the cluster stopped: %v", cgroups)
	}
}
