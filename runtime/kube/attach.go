package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// attach execs the attach program in the box's sandbox container through the API server
// (WebSocket, or SPDY where the server or a proxy cannot upgrade to WebSocket) and returns once
// the init answered with its ready byte and proved the pod's channel key
// (client.HostHandshake; a peer that fails it is errTampered). With provision (only the first
// attach of a pod it just made, whose PID 1 waits for its key) the key goes first, as the
// first line of the program's stdin (proto.ConnectProvision).
//
// The program is the connect program beside the init (guest/connect: C, where the init's own
// `connect` is a Go program, whose start in gVisor made each attach some 26 ms slower on the
// test cluster), and the init's `connect` where the program did not run (an image made before
// it existed): the first exec then ends without the ready byte and without a word of the
// program's own (proto.ConnectProgramError), and the attach runs again with the init. (An exec
// the API server refuses outright is tried twice so, and fails with the second answer.)
func (d *Driver) attach(ctx context.Context, id, name string, key []byte, provision bool) (io.ReadWriteCloser, error) {
	if !d.initConnect {
		rwc, err := d.attachWith(ctx, id, name, key, provision, connectPath)
		if !errors.Is(err, errNoConnectProgram) {
			return rwc, err
		}
		d.log.Debug("the connect program did not run; attaching with the init's connect", "box", id, "err", err)
	}
	return d.attachWith(ctx, id, name, key, provision, initPath, "connect")
}

// errNoConnectProgram says the attach's exec ended before the ready byte with no error of the
// connect program's own: the program did not run.
var errNoConnectProgram = errors.New("the connect program did not run")

// attachWith is attach through the program command (then, with provision, its arguments).
func (d *Driver) attachWith(ctx context.Context, id, name string, key []byte, provision bool, command ...string) (io.ReadWriteCloser, error) {
	if provision {
		command = append(command, proto.ConnectProvision, channelKeyFile)
	}
	exec, err := d.executor(name, containerName, command, true, false)
	if err != nil {
		return nil, fmt.Errorf("kube: attach %s: %w", id, err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	// The stream outlives ctx (ctx only bounds the wait for the ready byte): Close ends it.
	sctx, cancel := context.WithCancel(context.Background())
	s := &execStream{stdin: inW, stdout: outR, cancel: cancel, done: make(chan struct{})}
	stderr := &capped{max: 4 << 10}
	go func() {
		defer close(s.done)
		err := exec.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		if err == nil {
			err = io.EOF
		} else if msg := stderr.String(); msg != "" {
			err = fmt.Errorf("%w (stderr: %s)", err, msg)
		}
		outW.CloseWithError(err)
		// Reads now fail, so the guest client gives up; until then its writes go nowhere
		// (closing inR instead would make the stream's own stdin copier log an error).
		_, _ = io.Copy(io.Discard, inR)
	}()
	ready := make(chan error, 1)
	go func() {
		var err error
		if provision {
			_, err = s.Write([]byte(proto.EncodeChannelKey(key) + "\n"))
		}
		// The greeting goes before the ready byte comes: the program's stdin holds it until the
		// program dialled the init, which then finds it at once (a round trip less).
		var hello client.Hello
		if err == nil {
			hello, err = client.HostHello(s)
		}
		if err == nil {
			err = client.AwaitReady(outR)
			// The stream ended (its stderr is whole by then) before the ready byte: unless the
			// connect program said why, it did not run.
			if err != nil && !errors.Is(err, proto.ErrImpostor) && command[0] == connectPath &&
				!strings.Contains(stderr.String(), proto.ConnectProgramError) {
				err = fmt.Errorf("%w: %w", errNoConnectProgram, err)
			}
		}
		if err == nil {
			err = hello.Finish(s, key)
			// The pod's init answers a greeting at once; a peer that hangs up instead is not
			// it (a pod that died meanwhile is told apart by the caller).
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("%w: it closed the stream instead of proving the key", proto.ErrImpostor)
			}
		}
		ready <- err
	}()
	timeout := time.NewTimer(handshakeTimeout)
	defer timeout.Stop()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout.C:
		err = fmt.Errorf("no ready byte and handshake within %v", handshakeTimeout)
	}
	if err != nil {
		s.Close()
		if errors.Is(err, proto.ErrImpostor) {
			return nil, fmt.Errorf("kube: attach %s: %w: %w", id, errTampered, err)
		}
		return nil, fmt.Errorf("kube: attach %s: %w", id, err)
	}
	return s, nil
}

// executor is a pods/exec of command in container of pod name through the API server:
// WebSocket, or SPDY where the server or a proxy cannot upgrade to WebSocket; with spdyFirst
// the other way round.
func (d *Driver) executor(pod, container string, command []string, stdin, spdyFirst bool) (remotecommand.Executor, error) {
	req := d.cs.CoreV1().RESTClient().Post().Namespace(d.opts.Namespace).Resource("pods").Name(pod).
		SubResource("exec").VersionedParams(&corev1.PodExecOptions{
		Container: container,
		Command:   command,
		Stdin:     stdin,
		Stdout:    true,
		Stderr:    true,
	}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(d.opts.Config, http.MethodGet, req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(d.opts.Config, http.MethodPost, req.URL())
	if err != nil {
		return nil, err
	}
	first, second := ws, spdy
	if spdyFirst {
		first, second = spdy, ws
	}
	return remotecommand.NewFallbackExecutor(first, second, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// handshakeTimeout bounds an attach's wait for the ready byte and the handshake after the
// exec stream is set up.
const handshakeTimeout = 30 * time.Second

// errTampered marks an attach whose peer is not the box's guest init (it failed the handshake).
var errTampered = errors.New("the control channel was tampered with")

// execStream is one attach: the guest's stdin and stdout through a remotecommand stream.
type execStream struct {
	stdin     *io.PipeWriter
	stdout    *io.PipeReader
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

func (s *execStream) Read(p []byte) (int, error)  { return s.stdout.Read(p) }
func (s *execStream) Write(p []byte) (int, error) { return s.stdin.Write(p) }

// Close ends the attach: EOF on the guest's stdin (its connect then ends by itself, and so does
// the stream), its output drained meanwhile; a stream that has not ended within a second is cut.
func (s *execStream) Close() error {
	s.closeOnce.Do(func() {
		_ = s.stdin.Close()
		go func() { _, _ = io.Copy(io.Discard, s.stdout) }()
		select {
		case <-s.done:
		case <-time.After(time.Second):
		}
		s.cancel()
	})
	return nil
}

// capped keeps the first max bytes written to it (an attach's stderr, for its error).
type capped struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b, _ = client.AppendCapped(c.b, p, c.max, false)
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.b)
}

// Attach implements runtime.Driver.
func (d *Driver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	name, err := ObjectName(id)
	if err != nil {
		return nil, err
	}
	pvc, err := d.pvcs.Get(name)
	if apierrors.IsNotFound(err) || (err == nil && pvc.DeletionTimestamp != nil) {
		// The cache may trail a create that just returned: ask the API server.
		if _, err := d.getPVC(ctx, id, name); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	pod, err := d.pods.Get(name)
	if err != nil || pod.DeletionTimestamp != nil || !podReady(pod) {
		return nil, fmt.Errorf("kube: box %s: %w", id, runtime.ErrNotRunning)
	}
	if s := d.spares.Take(id); s != nil {
		return s, nil
	}
	if pod = d.freshUnlessProvisioned(ctx, name, pod); !provisioned(pod) {
		return nil, fmt.Errorf("kube: box %s: its guest init has not got its channel key (a create or start was cut short; start it again): %w", id, runtime.ErrNotRunning)
	}
	key, err := podChannelKey(pod)
	if err != nil {
		return nil, fmt.Errorf("kube: box %s: %w: %w", id, err, runtime.ErrNotRunning)
	}
	rwc, err := d.attach(ctx, id, name, key, false)
	if errors.Is(err, errTampered) {
		if p, gerr := d.pods.Get(name); gerr != nil || p.UID != pod.UID || p.DeletionTimestamp != nil || !podReady(p) {
			// The pod ended meanwhile: that, not tampering, is the news.
			return nil, fmt.Errorf("kube: box %s: its pod is gone or not ready: %w", id, runtime.ErrNotRunning)
		}
		return nil, d.tampered(ctx, id, name, err)
	}
	return rwc, err
}

// tampered records that the box's attach channel was tampered with (its pod answered the
// handshake like something else than the box's init), deletes its pod — a box that
// impersonates its init runs nothing more and, once the domain sees it failed, holds no slot —
// and returns the error Attach answers with. The box is failed, not lost: the domain does not
// start it again by itself. No other box is touched.
func (d *Driver) tampered(ctx context.Context, id, name string, cause error) error {
	reason := "the sandbox's control channel was tampered with, so its pod was deleted (" +
		strings.TrimPrefix(cause.Error(), "kube: ") + "); start it again to get a new one"
	d.log.Warn("box channel tampered with; deleting its pod", "box", id, "err", cause)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := d.updatePVC(cctx, id, name, func(pvc *corev1.PersistentVolumeClaim) error {
		pvc.Annotations[AnnCompute] = computeStopped
		pvc.Annotations[AnnTampered] = reason
		return nil
	}); err != nil {
		d.log.Error("recording a tampered channel", "box", id, "err", err)
	}
	d.spares.Drop(id)
	if err := d.deletePod(cctx, name, 0); err != nil {
		d.log.Error("deleting the pod of a box whose channel was tampered with", "box", id, "err", err)
	}
	return fmt.Errorf("kube: box %s: %s: %w", id, reason, runtime.ErrNotRunning)
}
