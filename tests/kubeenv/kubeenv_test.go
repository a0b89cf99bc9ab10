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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
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

func (e *env) createPVC(ctx context.Context, name string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PVC: %v", err)
	}
	return pvc
}

// runPod creates the pod and waits until it is Running and Ready.
func (e *env) runPod(ctx context.Context, pod *corev1.Pod) {
	t := e.t
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "pod Running and Ready", func(p *corev1.Pod) (bool, error) {
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			b, _ := json.MarshalIndent(p.Status, "", "  ")
			return false, fmt.Errorf("pod ended: %s", b)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return p.Status.Phase == corev1.PodRunning && c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

func (e *env) podUID(ctx context.Context, name string) string {
	p, err := e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get pod: %v", err)
	}
	return string(p.UID)
}

// deletePod deletes a pod with grace 0 and waits until it is gone.
func (e *env) deletePod(ctx context.Context, name string) {
	if err := e.client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
	waitGone[*corev1.Pod](ctx, e.t, e.client.CoreV1().Pods(namespace), name)
}

// waitNodeClean waits (briefly) until the node has no runsc container and no folder of pod uid.
func (e *env) waitNodeClean(ctx context.Context, uid string) {
	t := e.t
	deadline := time.Now().Add(10 * time.Second)
	podDir := filepath.Join(e.dir, "node", "pods", uid)
	for {
		states, _ := filepath.Glob(filepath.Join(runsc.RootFor(filepath.Join(e.dir, "node")), "*.state"))
		_, err := os.Stat(podDir)
		if len(states) == 0 && os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the pod was deleted: runsc containers %v, pod folder present: %v", states, err == nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// request builds the exec request of a command in the pod's sandbox container.
func (e *env) request(pod string, cmd []string, stdin bool) *rest.Request {
	return e.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "sandbox", Command: cmd, Stdin: stdin, Stdout: true, Stderr: true}, scheme.ParameterCodec)
}

// executor is a WebSocket executor falling back to SPDY, as the project's driver uses.
func (e *env) executor(req *rest.Request) remotecommand.Executor {
	ws, err := remotecommand.NewWebSocketExecutor(e.cfg, "GET", req.URL().String())
	if err != nil {
		e.t.Fatal(err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ex
}

// execErr runs cmd in the pod and returns its error (stdout and stderr discarded).
func (e *env) execErr(ctx context.Context, pod string, cmd []string, stdin io.Reader) error {
	var stdout, stderr bytes.Buffer
	return e.executor(e.request(pod, cmd, stdin != nil)).StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &stdout, Stderr: &stderr})
}

// exec runs cmd in the pod and returns its stdout; it fails the test on any error.
func (e *env) exec(ctx context.Context, pod string, cmd []string, stdin io.Reader) string {
	var stdout, stderr bytes.Buffer
	err := e.executor(e.request(pod, cmd, stdin != nil)).StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		e.t.Fatalf("exec %q: %v (stderr %q)", cmd, err, stderr.String())
	}
	return stdout.String()
}

// execSPDY runs cmd with the SPDY executor only.
func (e *env) execSPDY(ctx context.Context, pod string, cmd []string) string {
	req := e.request(pod, cmd, false)
	ex, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		e.t.Fatalf("SPDY exec %q: %v (stderr %q)", cmd, err, stderr.String())
	}
	return stdout.String()
}

// logExecLatency measures the round trip of a trivial exec through the API server.
func (e *env) logExecLatency(ctx context.Context) {
	var ds []time.Duration
	for range 7 {
		start := time.Now()
		e.exec(ctx, podName, []string{"/.sbx/init", "version"}, nil)
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	e.t.Logf("timing: exec round trip (`/.sbx/init version` via the API server): median %d ms, min %d ms, max %d ms",
		ds[len(ds)/2].Milliseconds(), ds[0].Milliseconds(), ds[len(ds)-1].Milliseconds())
}

// checkGuestHTTP2 does what the project's driver does through exec: `/.sbx/init connect`,
// the ready byte, then HTTP/2 requests to the guest init over the exec's stdin and stdout.
func (e *env) checkGuestHTTP2(ctx context.Context) {
	t := e.t
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		err := e.executor(e.request(podName, []string{"/.sbx/init", "connect"}, true)).
			StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: &stderr})
		outW.CloseWithError(fmt.Errorf("exec ended: %v", err))
		done <- err
	}()
	start := time.Now()
	var ready [1]byte
	if _, err := io.ReadFull(outR, ready[:]); err != nil || ready[0] != 0x06 {
		t.Fatalf("connect: ready byte: %v %#x (stderr %q)", err, ready[0], stderr.String())
	}
	t.Logf("timing: exec `/.sbx/init connect` → ready byte: %d ms", time.Since(start).Milliseconds())
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(&streamConn{r: outR, w: inW})
	if err != nil {
		t.Fatalf("HTTP/2 over exec: %v", err)
	}
	var ds []time.Duration
	for range 20 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://sandbox/v1/health", nil)
		start := time.Now()
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET /v1/health over exec: %v", err)
		}
		var h struct {
			OK bool `json:"ok"`
		}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || !h.OK || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/health over exec: %s %v %+v", resp.Status, err, h)
		}
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	t.Logf("timing: HTTP/2 GET /v1/health over the exec stream: median %.1f ms, max %.1f ms",
		float64(ds[len(ds)/2].Microseconds())/1000, float64(ds[len(ds)-1].Microseconds())/1000)
	cc.Close()
	inW.Close() // stdin EOF: connect ends, and with it the exec
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("connect exec ended with %v (stderr %q)", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("connect exec did not end after its stdin closed")
	}
}

// checkFailedPod runs a container that exits 7: the pod fails with its terminated state,
// and its output is in the logs.
func (e *env) checkFailedPod(ctx context.Context) {
	t := e.t
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "exits-7", Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "main", Image: baseImage, Command: []string{"sh", "-c", "echo bye; exit 7"}}},
		},
	}
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	p := waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "pod Failed", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodFailed, nil
	})
	term := p.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 7 || term.Reason != "Error" {
		t.Fatalf("container state: %+v", p.Status.ContainerStatuses[0].State)
	}
	logs, err := e.client.CoreV1().Pods(namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "bye") {
		t.Fatalf("logs: %q %v", logs, err)
	}
	e.deletePod(ctx, pod.Name)
}

// checkUnknownImage runs a pod with an image the node does not know.
func (e *env) checkUnknownImage(ctx context.Context) {
	t := e.t
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unknown-image", Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "main", Image: "sandboxd/missing:test", Command: []string{"sleep", "60"}}},
		},
	}
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	p := waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "container waiting ErrImageNeverPull", func(p *corev1.Pod) (bool, error) {
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason == "ErrImageNeverPull" {
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("unknown image: phase %s, waiting %q", p.Status.Phase, p.Status.ContainerStatuses[0].State.Waiting.Message)
	e.deletePod(ctx, pod.Name)
}

// checkInitFailure runs a pod whose init container exits 4: the pod fails with that
// terminated state and its container never starts.
func (e *env) checkInitFailure(ctx context.Context) {
	t := e.t
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "init-fails", Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			InitContainers: []corev1.Container{{Name: "init", Image: baseImage, Command: []string{"sh", "-c", "exit 4"}}},
			Containers:     []corev1.Container{{Name: "main", Image: baseImage, Command: []string{"sleep", "60"}}},
		},
	}
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	p := waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "pod Failed", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodFailed, nil
	})
	if len(p.Status.InitContainerStatuses) != 1 || p.Status.InitContainerStatuses[0].State.Terminated == nil ||
		p.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 4 {
		t.Fatalf("init container status: %+v", p.Status.InitContainerStatuses)
	}
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running != nil || cs[0].State.Terminated != nil {
		t.Fatalf("the container ran although the init container failed: %+v", cs)
	}
	e.deletePod(ctx, pod.Name)
}

// checkOOM runs a container that allocates far over its memory limit: it ends OOMKilled.
func (e *env) checkOOM(ctx context.Context) {
	t := e.t
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "oom", Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{
				Name: "main", Image: baseImage,
				Command:   []string{"python3", "-c", "import time; b = bytearray(512 << 20); time.sleep(60)"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}},
			}},
		},
	}
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	p := waitFor(ctx, t, e.client.CoreV1().Pods(namespace), pod.Name, "pod Failed", func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodFailed, nil
	})
	term := p.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Fatalf("container state: %+v", p.Status.ContainerStatuses[0].State)
	}
	e.deletePod(ctx, pod.Name)
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

// freePort returns a TCP port that is free on 127.0.0.1 right now.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// processesUsing lists the processes whose command line mentions path.
func processesUsing(path string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		if ent.Name()[0] < '0' || ent.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(path)) {
			continue
		}
		out = append(out, ent.Name()+": "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
	}
	return out
}

// dumpLogs prints the tails of the supervisor's and the programs' logs.
func dumpLogs(t *testing.T, supervisorLog, logDir string) {
	files, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
	for _, f := range append([]string{supervisorLog}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("==== %s (tail)\n%s", f, b)
	}
}

// getWatcher is the part of a typed client waitFor uses.
type getWatcher[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// waitFor watches the named object until cond holds (or fails), within 2 minutes.
func waitFor[T metav1.Object](ctx context.Context, t *testing.T, c getWatcher[T], name, what string, cond func(T) (bool, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last T
	for {
		obj, err := c.Get(ctx, name, metav1.GetOptions{})
		rv := ""
		if err == nil {
			last = obj
			ok, cerr := cond(obj)
			if cerr != nil {
				t.Fatalf("waiting for %s: %v", what, cerr)
			}
			if ok {
				return obj
			}
			rv = obj.GetResourceVersion()
		} else if !apierrors.IsNotFound(err) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
		if err != nil {
			t.Fatalf("waiting for %s: watch: %v", what, err)
		}
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(T)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			last = obj
			ok, cerr := cond(obj)
			if cerr != nil {
				w.Stop()
				t.Fatalf("waiting for %s: %v", what, cerr)
			}
			if ok {
				w.Stop()
				return obj
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("waiting for %s: %v; last seen:\n%s", what, ctx.Err(), b)
		}
	}
}

// waitGone watches the named object until it is deleted, within 2 minutes.
func waitGone[T metav1.Object](ctx context.Context, t *testing.T, c getWatcher[T], name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		obj, err := c.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("waiting for %s to go: %v", name, err)
		}
		w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: obj.GetResourceVersion()})
		if err != nil {
			t.Fatalf("waiting for %s to go: watch: %v", name, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			t.Fatalf("waiting for %s to go: %v", name, ctx.Err())
		}
	}
}

// streamConn is a net.Conn over an exec's stdout (reads) and stdin (writes).
type streamConn struct {
	r io.ReadCloser
	w io.WriteCloser
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *streamConn) Close() error {
	c.w.Close()
	return c.r.Close()
}
func (c *streamConn) LocalAddr() net.Addr              { return stubAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return stubAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

type stubAddr struct{}

func (stubAddr) Network() string { return "exec" }
func (stubAddr) String() string  { return "exec" }
