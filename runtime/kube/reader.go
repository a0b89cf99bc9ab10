package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/remotecommand"

	"sandboxd/runtime"
)

// The workspace reader: a stopped box's workspace read beside it. Inside gVisor, reading the
// PVC alone takes longer than the local runtime's whole stop (every read crosses the box's
// own kernel), and the guest's tar then goes through the API server's exec stream on one
// thread. Once the box's pod is gone, nothing changes the workspace any more: a short-lived
// pod on the cluster's native runtime (WorkspaceReader.RuntimeClass; usually runc) mounts the
// PVC read-only and the driver execs the init's `export` in it, which walks the files at the
// node's file system speed and compresses the tar on every core it has before the stream.
//
// What the reader trusts: nothing of the workspace. The tenant's code never runs in the
// reader pod (its process is the init's `idle`, from the init image, not the tenant's
// image); the walk never follows a symlink, opens no FIFO or device for reading, and the
// domain bounds the stream by the box's disk (a sparse file cannot make it endless). The pod
// runs as root to read files of every owner, with every capability dropped but DAC_OVERRIDE
// (DAC_READ_SEARCH would be enough, but the namespace's "baseline" Pod Security refuses it;
// the volume is read-only either way), a read-only root, no service account token and no
// privilege escalation; it ends by itself after readerDeadline even if no replica is left to
// delete it.

// readerSuffix makes a box's reader pod's name from the box's object name.
const readerSuffix = "-reader"

// LabelRole marks a pod that is no box's compute: "workspace-reader". LabelReaderOf is the
// sandbox id whose PVC a reader pod reads: not LabelSandboxID, which the box's NetworkPolicy
// selects, so that no policy lets a reader's traffic out (the namespace's default deny holds
// it; the reader needs no network).
const (
	LabelRole     = "sandboxd.io/role"
	LabelReaderOf = "sandboxd.io/reader-of"
)

const roleReader = "workspace-reader"

// readerDeadline is the reader pod's activeDeadlineSeconds: the node ends a reader left behind
// by a replica that died while reading.
const readerDeadline = 3600

// readerContainer is the reader pod's container name.
const readerContainer = "reader"

// readerInitPath is where the init image holds the init (the init container runs it there).
const readerInitPath = "/sandbox-init"

// WorkspaceReader configures reading a stopped box's workspace beside it (the zero value: off,
// every checkpoint then comes through the box's guest).
type WorkspaceReader struct {
	// Enabled turns the reader on. It needs the init image (kube.init_image), whose init the
	// reader pod runs.
	Enabled bool `json:"enabled"`
	// RuntimeClass is the reader pods' runtimeClassName; empty takes the cluster's default
	// runtime (on most clusters runc: the native runtime the reader is for).
	RuntimeClass string `json:"runtime_class"`
	// MilliCPU and MemoryBytes are the reader pod's limits (defaults 2000 and 512 MiB): its
	// compression runs on as many cores as it gets.
	MilliCPU    int64 `json:"milli_cpu"`
	MemoryBytes int64 `json:"memory_bytes"`
}

func (w WorkspaceReader) withDefaults() WorkspaceReader {
	if w.MilliCPU <= 0 {
		w.MilliCPU = 2000
	}
	if w.MemoryBytes <= 0 {
		w.MemoryBytes = 512 << 20
	}
	return w
}

var _ runtime.StoppedWorkspaceReader = (*Driver)(nil)

// ReadsStoppedWorkspaces implements runtime.StoppedWorkspaceReader.
func (d *Driver) ReadsStoppedWorkspaces() bool { return d.opts.WorkspaceReader.Enabled }

// ExportStoppedWorkspace implements runtime.StoppedWorkspaceReader: a reader pod on the box's
// PVC, the init's export exec'd in it, its zstd stream returned as it comes. The pod is
// deleted when the stream is closed.
func (d *Driver) ExportStoppedWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	name, err := d.readerTarget(ctx, id)
	if err != nil {
		return nil, err
	}
	if _, err := d.pods.Get(name); err == nil {
		return nil, fmt.Errorf("kube: box %s: its pod is still there: %w", id, runtime.ErrNotRunning)
	}
	rd, err := d.startReader(ctx, id, name, "")
	if err != nil {
		return nil, err
	}
	return d.readWith(id, rd)
}

// StopAndExport implements runtime.StoppedWorkspaceReader: Stop, while the reader pod starts
// beside the box's terminating pod, on the node that pod ran on (where the PVC is attached: no
// detach and attach again, and no scheduling). The reader execs its export once Stop returned,
// that is once the box's pod is gone and nothing writes the workspace any more.
func (d *Driver) StopAndExport(ctx context.Context, id string) (io.ReadCloser, error) {
	name, err := d.readerTarget(ctx, id)
	if err != nil {
		return nil, err
	}
	node := ""
	if pod, err := d.pods.Get(name); err == nil && pod.DeletionTimestamp == nil {
		node = pod.Spec.NodeName
	}
	started := make(chan readerOrError, 1)
	go func() {
		rd, err := d.startReader(ctx, id, name, node)
		started <- readerOrError{rd, err}
	}()
	err = d.stopBox(ctx, id, name) // fenced above
	st := <-started
	if err != nil {
		if st.err == nil {
			st.rd.release()
		}
		return nil, err
	}
	if st.err != nil {
		return failedStream{st.err}, nil
	}
	rc, err := d.readWith(id, st.rd)
	if err != nil {
		return failedStream{err}, nil
	}
	return rc, nil
}

// readerTarget is the object name of box id, whose workspace a reader may read: the reader
// is on, the box exists, and the caller's fence is admitted. A caller fenced off must not
// start a reader: startReader deletes the box's reader pod, which may be another replica's,
// reading.
func (d *Driver) readerTarget(ctx context.Context, id string) (string, error) {
	if !d.opts.WorkspaceReader.Enabled {
		return "", errReaderOff
	}
	name, err := ObjectName(id)
	if err != nil {
		return "", err
	}
	pvc, err := d.getPVC(ctx, id, name)
	if err != nil {
		return "", err
	}
	if _, err := d.fence(ctx, id, name, pvc); err != nil {
		return "", err
	}
	return name, nil
}

var errReaderOff = errors.New("kube: the workspace reader is not configured (kube.workspace_reader)")

// readerPod is a started reader pod of a box.
type readerPod struct {
	name    string
	release func() // deletes the pod, not waiting
}

type readerOrError struct {
	rd  readerPod
	err error
}

// failedStream is a workspace stream whose reader failed before its first byte.
type failedStream struct{ err error }

func (f failedStream) Read([]byte) (int, error) { return 0, f.err }
func (f failedStream) Close() error             { return nil }

// startReader makes the reader pod of box id (object name) and waits until it runs; on node
// when not empty (the pod then bypasses the scheduler), else where the scheduler puts it.
func (d *Driver) startReader(ctx context.Context, id, name, node string) (readerPod, error) {
	start := time.Now()
	rname := name + readerSuffix
	// A reader left by an earlier read (a replica that died) goes first: it may be of an
	// earlier life of the box, and its name is taken.
	if err := d.deletePod(ctx, rname, 0); err != nil {
		return readerPod{}, err
	}
	pod := d.set.newReaderPod(rname, name, id, d.opts.WorkspaceReader)
	pod.Spec.NodeName = node
	created, err := d.cs.CoreV1().Pods(d.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return readerPod{}, fmt.Errorf("kube: create the workspace reader of %s: %w", id, err)
	}
	release := func() {
		// Not waited for: the pod only reads, and the next reader of the box deletes a
		// leftover first.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		zero := int64(0)
		err := d.cs.CoreV1().Pods(d.opts.Namespace).Delete(cctx, rname, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &created.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			d.log.Warn("deleting a workspace reader", "box", id, "pod", rname, "err", err)
		}
	}
	if err := d.waitReader(ctx, id, rname, created.UID); err != nil {
		release()
		return readerPod{}, err
	}
	d.log.Info("workspace reader running", "box", id, "node", node, "ms", time.Since(start).Milliseconds())
	return readerPod{name: rname, release: release}, nil
}

// readWith execs the export in started reader rd; the pod goes with the stream.
func (d *Driver) readWith(id string, rd readerPod) (io.ReadCloser, error) {
	rc, err := d.execExport(id, rd.name)
	if err != nil {
		rd.release()
		return nil, err
	}
	return &readerStream{exportStream: rc, release: rd.release}, nil
}

// waitReader waits until the reader pod runs, or fails with why it cannot.
func (d *Driver) waitReader(ctx context.Context, id, name string, uid types.UID) error {
	err := d.waitPod(ctx, name, uid, podWait{what: "the reader pod", ready: func(pod *corev1.Pod) string {
		if pod.Status.Phase != corev1.PodRunning {
			return "the reader pod is " + string(pod.Status.Phase) + waitingReason(pod)
		}
		return ""
	}})
	if err != nil {
		return fmt.Errorf("kube: the workspace reader of %s: %w", id, err)
	}
	return nil
}

// execExport execs the init's export of the workspace in reader pod name and returns its
// stdout, the zstd-compressed tar. The stream's end is the exec's: a reader that failed (its
// exit status, or a stream cut more often than resumeExport reads again) ends it with that
// error, never with io.EOF.
func (d *Driver) execExport(id, name string) (*exportStream, error) {
	// SPDY first, unlike the attach: for one bulk stream out of the pod it carried 50 MB in
	// 240-254 ms on the test cluster, against 312-348 ms for WebSocket. Either may lose the
	// stream's tail when the exec ends while a slow reader has not read it yet (the API server
	// resets the connection): resumeExport tells by the export's end mark and reads the rest.
	argv := []string{readerInitPath, "export", workspacePath}
	if _, err := d.executor(name, readerContainer, argv, false, true); err != nil {
		return nil, fmt.Errorf("kube: workspace reader of %s: %w", id, err)
	}
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	s := &exportStream{pipe: outR, cancel: cancel, done: make(chan struct{})}
	run := func(ctx context.Context, stdout, stderr io.Writer) error {
		exec, err := d.executor(name, readerContainer, argv, false, true)
		if err != nil {
			return err
		}
		return exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	}
	go func() {
		defer close(s.done)
		if err := resumeExport(sctx, outW, run, d.log.With("box", id, "pod", name)); err != nil {
			outW.CloseWithError(fmt.Errorf("kube: workspace reader of %s: %w", id, err))
			return
		}
		outW.Close()
	}()
	return s, nil
}

// exportStream is a reader pod's export: its stdout.
type exportStream struct {
	pipe   *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (s *exportStream) Read(p []byte) (int, error) { return s.pipe.Read(p) }

func (s *exportStream) Close() error {
	s.once.Do(func() {
		s.cancel()
		// Drained rather than closed: the stream's own copier would log a write to a closed
		// pipe as an error. The cancel ends the stream soon.
		go func() { _, _ = io.Copy(io.Discard, s.pipe) }()
		<-s.done
	})
	return nil
}

// readerStream is ExportStoppedWorkspace's stream: closing it also deletes the reader pod.
type readerStream struct {
	*exportStream
	release func()
	once    sync.Once
}

func (r *readerStream) Close() error {
	err := r.exportStream.Close()
	r.once.Do(r.release)
	return err
}

// newReaderPod is the reader pod of box id (object name box) under name: the init image's
// init idling, the box's PVC mounted read-only at /workspace.
func (s podSettings) newReaderPod(name, box, id string, w WorkspaceReader) *corev1.Pod {
	w = w.withDefaults()
	no, yes, root, grace, deadline := false, true, int64(0), int64(0), int64(readerDeadline)
	cpu := *resource.NewMilliQuantity(w.MilliCPU, resource.DecimalSI)
	mem := *resource.NewQuantity(w.MemoryBytes, resource.BinarySI)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace, Labels: map[string]string{
			LabelManagedBy: managedBy,
			LabelReaderOf:  id,
			LabelRole:      roleReader,
		}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			ActiveDeadlineSeconds:         &deadline,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:    readerContainer,
				Image:   s.initImage,
				Command: []string{readerInitPath, "idle"},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem},
					// Small requests: a reader lives for one read, and one left by a replica
					// that died holds no more than this until its deadline.
					Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(100, resource.DecimalSI),
						corev1.ResourceMemory: *resource.NewQuantity(min(w.MemoryBytes, 128<<20), resource.BinarySI)},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: workspaceVolume, MountPath: workspacePath, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &root,
					RunAsNonRoot:             &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities: &corev1.Capabilities{
						Drop: []corev1.Capability{"ALL"},
						Add:  []corev1.Capability{"DAC_OVERRIDE"},
					},
				},
			}},
			Volumes: []corev1.Volume{{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: box, ReadOnly: true},
			}}},
		},
	}
	if w.RuntimeClass != "" {
		rc := w.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	return pod
}
