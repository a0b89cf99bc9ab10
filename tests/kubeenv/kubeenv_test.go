package kubeenv_test

// The smoke check of the whole test cluster: `kubeenv up` in a temporary folder, then the
// pod shape the project's Kubernetes driver creates, run for real under gVisor, exec'd into
// (WebSocket with SPDY fallback, and SPDY alone), deleted, recreated on the same volume,
// and the cluster stopped with nothing left behind.
//
// It runs only when these are set (it is skipped otherwise):
//
//	KUBEENV_BIN      the programs' folder (scripts/ensure-kubeenv.sh prints it)
//	SANDBOXD_RUNSC   a runsc binary (scripts/ensure-runsc.sh)
//	SANDBOXD_ROOTFS  a debootstrap base rootfs (scripts/ensure-rootfs.sh sandboxes-default)
//
//	cd tests/kubeenv && KUBEENV_BIN=$(../../scripts/ensure-kubeenv.sh) \
//	  SANDBOXD_RUNSC=$(../../scripts/ensure-runsc.sh) \
//	  SANDBOXD_ROOTFS=$(../../scripts/ensure-rootfs.sh sandboxes-default) go test -v ./...

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	utilexec "k8s.io/client-go/util/exec"

	"sandboxd/tests/kubeenv/internal/runsc"
)

const (
	namespace = "sandbox-jobs"
	podName   = "sbx-01jkubeenvsmoke0000000000"
	initImage = "sandboxd/sandbox-init:test"
	baseImage = "sandboxd/base:test"
)

// env holds the test's cluster.
type env struct {
	t       *testing.T
	dir     string // the cluster's folder
	rootfs  string
	cfg     *rest.Config
	client  kubernetes.Interface
	sup     *exec.Cmd
	supDone chan error
}

func TestKubeenv(t *testing.T) {
	bin, runscPath, rootfs := os.Getenv("KUBEENV_BIN"), os.Getenv("SANDBOXD_RUNSC"), os.Getenv("SANDBOXD_ROOTFS")
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal // scripts/test.sh sets all three: under CI a missing one is a broken script
	}
	if bin == "" || runscPath == "" || rootfs == "" {
		skip("set KUBEENV_BIN (scripts/ensure-kubeenv.sh), SANDBOXD_RUNSC (scripts/ensure-runsc.sh) and SANDBOXD_ROOTFS (scripts/ensure-rootfs.sh sandboxes-default) to run the cluster smoke check")
	}
	if os.Geteuid() != 0 {
		skip("runsc needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tmp := t.TempDir()

	// The init image: a folder holding only the static guest init, as /sandbox-init.
	initDir := filepath.Join(tmp, "init-image")
	hasInstall := buildInit(t, initDir)

	e := startCluster(ctx, t, tmp, bin, runscPath, rootfs, initDir)
	e.setup(ctx)

	// The PVC the pod's workspace lives on (default storage class).
	start := time.Now()
	pvc := e.createPVC(ctx, podName)
	pvc = waitFor(ctx, t, e.client.CoreV1().PersistentVolumeClaims(namespace), pvc.Name, "PVC bound",
		func(c *corev1.PersistentVolumeClaim) (bool, error) { return c.Status.Phase == corev1.ClaimBound, nil })
	t.Logf("timing: PVC created → Bound: %d ms (PV %s)", time.Since(start).Milliseconds(), pvc.Spec.VolumeName)

	// The driver's pod shape, Running.
	pod := driverPod(podName, hasInstall, initDir)
	start = time.Now()
	e.runPod(ctx, pod)
	t.Logf("timing: pod created → Running+Ready: %d ms", time.Since(start).Milliseconds())

	// Exec: the guest init, a file on the PVC, the environment, a failing command, 1 MB of stdin.
	out := e.exec(ctx, podName, []string{"/.sbx/init", "version"}, nil)
	if strings.TrimSpace(out) == "" {
		t.Fatalf("/.sbx/init version printed nothing")
	}
	if out := e.exec(ctx, podName, []string{"sh", "-c", "echo hi > /workspace/f; cat /workspace/f"}, nil); out != "hi\n" {
		t.Fatalf("write+read on the PVC: got %q, want %q", out, "hi\n")
	}
	if out := e.exec(ctx, podName, []string{"sh", "-c", `echo "$FOO"; pwd`}, nil); out != "bar\n/workspace\n" {
		t.Fatalf("env and workingDir: got %q", out)
	}
	if out := e.execSPDY(ctx, podName, []string{"cat", "/workspace/f"}); out != "hi\n" {
		t.Fatalf("SPDY exec: got %q", out)
	}
	err := e.execErr(ctx, podName, []string{"sh", "-c", "echo oops >&2; exit 3"}, nil)
	var ce utilexec.CodeExitError
	if !errors.As(err, &ce) || ce.Code != 3 {
		t.Fatalf("exit 3: got %v (%T), want a CodeExitError with code 3", err, err)
	}
	// Writes outside volumes go to the sandbox's memory, never to the image folder; the
	// read-only /.sbx mount refuses writes.
	if out := e.exec(ctx, podName, []string{"sh", "-c", "echo x > /etc/kubeenv-probe && cat /etc/kubeenv-probe; touch /.sbx/x 2>/dev/null && echo writable || echo read-only"}, nil); out != "x\nread-only\n" {
		t.Fatalf("root overlay / read-only mount: got %q", out)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc", "kubeenv-probe")); err == nil {
		t.Fatalf("a write inside the sandbox reached the image folder %s", rootfs)
	}
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	start = time.Now()
	if out := e.exec(ctx, podName, []string{"cat"}, bytes.NewReader(big)); out != string(big) {
		t.Fatalf("1 MiB through cat: got %d bytes back, equal=%v", len(out), out == string(big))
	}
	t.Logf("timing: 1 MiB stdin → cat → stdout: %d ms", time.Since(start).Milliseconds())
	e.checkSlowClient(ctx)
	e.logExecLatency(ctx)
	e.checkGuestHTTP2(ctx)

	// Delete with grace 0: gone at once, and so are its runsc containers and folder.
	uid := e.podUID(ctx, podName)
	start = time.Now()
	e.deletePod(ctx, podName)
	t.Logf("timing: pod delete (grace 0) → gone: %d ms", time.Since(start).Milliseconds())
	e.waitNodeClean(ctx, uid)

	// Recreated on the same PVC: the file is there.
	start = time.Now()
	e.runPod(ctx, driverPod(podName, hasInstall, initDir))
	t.Logf("timing: pod recreated → Running+Ready: %d ms", time.Since(start).Milliseconds())
	if out := e.exec(ctx, podName, []string{"cat", "/workspace/f"}, nil); out != "hi\n" {
		t.Fatalf("file on the PVC after the pod was recreated: got %q", out)
	}
	// A default delete (grace 5 s): the guest init exits on SIGTERM and the node deletes the
	// pod from the API at once, as a kubelet does, well before the grace period ends.
	uid = e.podUID(ctx, podName)
	start = time.Now()
	if err := e.client.CoreV1().Pods(namespace).Delete(ctx, podName, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	waitGone[*corev1.Pod](ctx, t, e.client.CoreV1().Pods(namespace), podName)
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("a default delete took %s: the node should end it before the 5 s grace period", d)
	}
	t.Logf("timing: pod delete (default grace 5 s) → gone: %d ms", time.Since(start).Milliseconds())
	e.waitNodeClean(ctx, uid)

	// A container that exits non-zero: pod Failed, terminated state and logs.
	e.checkFailedPod(ctx)
	// An image the node does not know: the container waits with ErrImageNeverPull.
	e.checkUnknownImage(ctx)
	// An init container that fails, and a container over its memory limit.
	e.checkInitFailure(ctx)
	e.checkOOM(ctx)

	// Deleting the PVC reclaims the PV and its folder.
	pvDir := filepath.Join(e.dir, "node", "pv", string(pvc.UID))
	if _, err := os.Stat(pvDir); err != nil {
		t.Fatalf("PV folder: %v", err)
	}
	start = time.Now()
	if err := e.client.CoreV1().PersistentVolumeClaims(namespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete PVC: %v", err)
	}
	waitGone[*corev1.PersistentVolumeClaim](ctx, t, e.client.CoreV1().PersistentVolumeClaims(namespace), pvc.Name)
	waitGone[*corev1.PersistentVolume](ctx, t, e.client.CoreV1().PersistentVolumes(), pvc.Spec.VolumeName)
	t.Logf("timing: PVC delete → PV gone: %d ms", time.Since(start).Milliseconds())
	if _, err := os.Stat(pvDir); !os.IsNotExist(err) {
		t.Fatalf("PV folder %s still there after the PV was reclaimed (%v)", pvDir, err)
	}

	e.stop(ctx)
}

// buildInit builds the guest init (CGO_ENABLED=0) into dir/sandbox-init and reports whether
// it has the `install` subcommand.
func buildInit(t *testing.T, dir string) bool {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "sandbox-init"), "./cmd/sandbox-init")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sandbox-init: %v\n%s", err, out)
	}
	src, err := os.ReadFile(filepath.Join(repo, "cmd", "sandbox-init", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(src, []byte(`case "install":`))
}

// driverPod is the pod the project's Kubernetes driver creates. Without the init's
// `install` subcommand, the init container copies the binary from a hostPath instead.
func driverPod(name string, hasInstall bool, initDir string) *corev1.Pod {
	initC := corev1.Container{
		Name:         "install-init",
		Image:        initImage,
		Command:      []string{"/sandbox-init", "install", "/.sbx/init"},
		VolumeMounts: []corev1.VolumeMount{{Name: "sbx", MountPath: "/.sbx"}},
	}
	volumes := []corev1.Volume{
		{Name: "sbx", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "workspace", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}},
	}
	if !hasInstall {
		initC.Image = baseImage
		initC.Command = []string{"sh", "-c", "cp /src/sandbox-init /.sbx/init && chmod 0755 /.sbx/init"}
		initC.VolumeMounts = append(initC.VolumeMounts, corev1.VolumeMount{Name: "src", MountPath: "/src", ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "src", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: initDir}}})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "sandboxd", "sandboxd.io/sandbox": name},
			Annotations: map[string]string{"sandboxd.io/profile": "sandboxes-default"},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:              new("gvisor"),
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  new(false),
			EnableServiceLinks:            new(false),
			TerminationGracePeriodSeconds: new(int64(5)),
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			InitContainers:                []corev1.Container{initC},
			Containers: []corev1.Container{{
				Name:       "sandbox",
				Image:      baseImage,
				Command:    []string{"/.sbx/init", "serve"},
				WorkingDir: "/workspace",
				Env:        []corev1.EnvVar{{Name: "FOO", Value: "bar"}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "sbx", MountPath: "/.sbx", ReadOnly: true},
					{Name: "workspace", MountPath: "/workspace"},
				},
			}},
			Volumes: volumes,
		},
	}
}

// startCluster runs `kubeenv up` and waits for its KUBECONFIG line.
func startCluster(ctx context.Context, t *testing.T, tmp, bin, runscPath, rootfs, initDir string) *env {
	t.Helper()
	dir := filepath.Join(tmp, "cluster")
	stderr, err := os.Create(filepath.Join(tmp, "kubeenv.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stderr.Close() })
	args := []string{"up", "--dir", dir, "--bin", bin, "--runsc", runscPath,
		"--image", initImage + "=" + initDir, "--image", baseImage + "=" + rootfs}
	// Free ports rather than the defaults: another cluster may run on this machine.
	for _, flag := range []string{"apiserver-port", "etcd-port", "etcd-peer-port", "kubelet-port", "controller-manager-port", "scheduler-port"} {
		args = append(args, fmt.Sprintf("--%s=%d", flag, freePort(t)))
	}
	cmd := exec.Command(filepath.Join(bin, "kubeenv"), args...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kubeenv: %v", err)
	}
	e := &env{t: t, dir: dir, rootfs: rootfs, sup: cmd, supDone: make(chan error, 1)}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		e.supDone <- cmd.Wait()
	}()
	// Whatever happens, the supervisor is stopped by its pid and the logs shown on failure.
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, stderr.Name(), filepath.Join(dir, "logs"))
		}
		e.stopQuietly()
	})
	kubeconfig := ""
	timeout := time.After(3 * time.Minute)
	for kubeconfig == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("kubeenv up exited before the cluster was ready (log: %s)", stderr.Name())
			}
			t.Logf("kubeenv: %s", line)
			if v, found := strings.CutPrefix(line, "KUBECONFIG="); found {
				kubeconfig = v
			}
		case <-timeout:
			t.Fatalf("kubeenv up: no KUBECONFIG line after 3 min")
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	t.Logf("timing: kubeenv up → ready: %d ms", time.Since(start).Milliseconds())
	go func() {
		for range lines {
		}
	}()
	for _, f := range []string{"ready", "env", "admin.kubeconfig"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("kubeenv did not write %s: %v", f, err)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = cfg
	if e.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// setup creates the RuntimeClass and the namespace, and waits for its default service account.
func (e *env) setup(ctx context.Context) {
	t := e.t
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	if _, err := e.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create runtime class: %v", err)
	}
	start := time.Now()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := e.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	waitFor(ctx, t, e.client.CoreV1().ServiceAccounts(namespace), "default", "default service account",
		func(*corev1.ServiceAccount) (bool, error) { return true, nil })
	t.Logf("timing: namespace created → default service account: %d ms", time.Since(start).Milliseconds())
}

// stop stops the supervisor by its pid and checks that nothing of the cluster is left: no
// runsc container, no process started from the cluster's folder, no mount under it.
func (e *env) stop(ctx context.Context) {
	t := e.t
	start := time.Now()
	if err := e.sup.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal kubeenv: %v", err)
	}
	select {
	case err := <-e.supDone:
		if err != nil {
			t.Fatalf("kubeenv exited with %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("kubeenv did not exit within 60 s of SIGTERM")
	}
	e.sup = nil
	t.Logf("timing: kubeenv stop (SIGTERM → exit 0): %d ms", time.Since(start).Milliseconds())
	if states, _ := filepath.Glob(filepath.Join(runsc.RootFor(filepath.Join(e.dir, "node")), "*.state")); len(states) > 0 {
		t.Fatalf("runsc containers left: %v", states)
	}
	if procs := processesUsing(e.dir); len(procs) > 0 {
		t.Fatalf("processes left that use %s: %v", e.dir, procs)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), e.dir) {
		t.Fatalf("mounts left under %s", e.dir)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "ready")); !os.IsNotExist(err) {
		t.Fatalf("DIR/ready still there after exit")
	}
}

// stopQuietly stops the supervisor if it still runs (test failure paths).
func (e *env) stopQuietly() {
	if e.sup == nil || e.sup.Process == nil {
		return
	}
	_ = e.sup.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.supDone:
	case <-time.After(40 * time.Second):
		_ = e.sup.Process.Kill()
		<-e.supDone
	}
	e.sup = nil
}
