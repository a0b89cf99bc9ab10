package kubeenv_test

import (
	"bytes"
	"context"
	"io"
	"slices"
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
