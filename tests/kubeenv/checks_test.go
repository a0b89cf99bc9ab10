package kubeenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"
)

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
