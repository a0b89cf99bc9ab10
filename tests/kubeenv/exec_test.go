package kubeenv_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
)

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

// stallingWriter counts what it is given, taking at most rate bytes a second, and stalls
// once for stall on its first write after exited was written to.
type stallingWriter struct {
	n       int64
	rate    int64
	stall   time.Duration
	stalled bool
	exited  *timeWriter
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	if !w.stalled && !w.exited.at().IsZero() {
		w.stalled = true
		time.Sleep(w.stall)
	}
	time.Sleep(time.Duration(int64(len(p)) * int64(time.Second) / w.rate))
	return len(p), nil
}

// timeWriter notes when it was first written to.
type timeWriter struct {
	mu    sync.Mutex
	first time.Time
}

func (w *timeWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	w.mu.Unlock()
	return len(p), nil
}

func (w *timeWriter) at() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first
}

// checkSlowClient: a command's output reaches a client that reads it slower than the command
// writes, and that stalls for 3 s once the command exited (it says so on stderr, which
// comes at once), to its last byte. When the command exits, its last bytes are still on their
// way (in the node's pipe, the stream's window and the sockets): the node ends the exec only
// once the output has gone, not a fixed time (2 s) after the exit. SPDY: the project's driver
// reads bulk output (the workspace reader's export) over SPDY; over WebSocket the API server
// resets the client's connection when the exec ends, losing what the client had not read yet
// (the API server's translator, not the node).
func (e *env) checkSlowClient(ctx context.Context) {
	const size, rate = 2 << 20, 1 << 20
	cmd := []string{"sh", "-c", "head -c " + strconv.Itoa(size) + " /dev/zero; echo exited >&2"}
	req := e.request(podName, cmd, false)
	ex, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	exited := &timeWriter{}
	w := &stallingWriter{rate: rate, stall: 3 * time.Second, exited: exited}
	start := time.Now()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: w, Stderr: exited})
	if err != nil || w.n != size {
		e.t.Fatalf("%d MiB to a client reading %d KiB/s and stalling 3 s after the exit: got %d bytes, %v; want all of it",
			size>>20, rate>>10, w.n, err)
	}
	end := time.Now()
	e.t.Logf("timing: %d MiB to a client reading %d KiB/s and stalling 3 s after the exit: %d ms, the last %d ms after the exit",
		size>>20, rate>>10, end.Sub(start).Milliseconds(), end.Sub(exited.at()).Milliseconds())
}
