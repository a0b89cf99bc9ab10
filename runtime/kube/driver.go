// Package kube is the Kubernetes runtime driver: per sandbox one PVC (the workspace, and the
// sandbox's record in its annotations) and, while it runs, one gVisor pod in one namespace
// (sandbox-jobs). The Kubernetes objects are the runtime truth:
//
//	PVC  <name>   labels: managed-by, sandbox id, tenant, project, profile
//	              annotations: sandboxd.io/{tenant,project,spec,state,…}: the record
//	              sandboxd.io/compute: "running" while a pod should exist (set by create and
//	              start, cleared by stop): a missing pod then means it was deleted under us
//	              sandboxd.io/fence: the highest fence a write carried (runtime.WithFence);
//	              every write checks it first and refuses a lower one
//	Pod  <name>   runtimeClassName gvisor; an init container copies the guest init
//	              (cmd/sandbox-init, from Options.InitImage) into an emptyDir; the sandbox
//	              container runs it as PID 1 over the profile's image with the PVC at /workspace
//
// <name> is the sandbox id in lower case with "-" for "_". Stop deletes the pod and keeps the
// PVC; start creates a pod on the same PVC; delete removes both. Pods and PVCs are watched by
// informers (one label-selected watch each): readiness, stop and delete wait on the watch, and
// Get and List read its cache, except the record, which Get and UpdateRecord read from the API
// server so every caller reads its own writes. Attach is a remotecommand exec (WebSocket,
// falling back to SPDY) of the guest init's `connect` command through the API server.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"sandboxd/runtime"
)

// Options configure a Driver.
type Options struct {
	// Config reaches the API server (in-cluster or from a kubeconfig).
	Config *rest.Config
	// Namespace holds the sandboxes' pods and PVCs; default "sandbox-jobs".
	Namespace string
	// InitImage is the image holding the static guest init at /sandbox-init. Required.
	InitImage string
	// RuntimeClass is the pods' runtimeClassName; default "gvisor".
	RuntimeClass string
	// StorageClass is the PVCs' storage class; empty takes the cluster's default.
	StorageClass string
	// ReadyTimeout bounds how long Create and Start wait for a pod to run; default 2 min.
	ReadyTimeout time.Duration
	// UnschedulableTimeout is how long a pod may stay unschedulable before Create or Start
	// gives up with the scheduler's reason; default 30 s (a cluster autoscaler may add a node
	// meanwhile).
	UnschedulableTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Driver is the Kubernetes runtime driver. It implements runtime.Driver. Close stops its
// informers.
type Driver struct {
	opts   Options
	set    podSettings
	cs     kubernetes.Interface
	log    *slog.Logger
	pods   listersv1.PodNamespaceLister
	pvcs   listersv1.PersistentVolumeClaimNamespaceLister
	stopCh chan struct{}
	synced []cache.InformerSynced

	// changed is closed and replaced whenever the informers see a change: waiters re-check.
	changeMu sync.Mutex
	changed  chan struct{}

	// spares holds, per box, the ready attach of its last create or start.
	spares runtime.Spares

	closeOnce sync.Once
}

var _ runtime.Driver = (*Driver)(nil)

// New connects to the API server and starts the driver's informers, returning once their
// caches are filled.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Config == nil {
		return nil, errors.New("kube: Options.Config is required")
	}
	if opts.InitImage == "" {
		return nil, errors.New("kube: Options.InitImage is required (the image holding /sandbox-init)")
	}
	if opts.Namespace == "" {
		opts.Namespace = "sandbox-jobs"
	}
	if opts.RuntimeClass == "" {
		opts.RuntimeClass = "gvisor"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	if opts.UnschedulableTimeout <= 0 {
		opts.UnschedulableTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := rest.CopyConfig(opts.Config)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "sandboxd"
	}
	// The reconciler, lookups and every exec's attach share this client: the defaults
	// (5 QPS, burst 10) would throttle a busy replica.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 200, 400
	}
	opts.Config = cfg
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	d := &Driver{
		opts: opts,
		set: podSettings{
			namespace:    opts.Namespace,
			initImage:    opts.InitImage,
			runtimeClass: opts.RuntimeClass,
			storageClass: opts.StorageClass,
		},
		cs:      cs,
		log:     opts.Logger.With("driver", "kube"),
		stopCh:  make(chan struct{}),
		changed: make(chan struct{}),
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelManagedBy + "=" + managedBy
		}))
	podInf := factory.Core().V1().Pods()
	pvcInf := factory.Core().V1().PersistentVolumeClaims()
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.notify() },
		UpdateFunc: func(any, any) { d.notify() },
		DeleteFunc: func(any) { d.notify() },
	}
	for _, inf := range []cache.SharedIndexInformer{podInf.Informer(), pvcInf.Informer()} {
		if _, err := inf.AddEventHandler(notify); err != nil {
			return nil, fmt.Errorf("kube: %w", err)
		}
		d.synced = append(d.synced, inf.HasSynced)
	}
	d.pods = podInf.Lister().Pods(opts.Namespace)
	d.pvcs = pvcInf.Lister().PersistentVolumeClaims(opts.Namespace)
	factory.Start(d.stopCh)
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), d.synced...) {
		d.Close()
		return nil, fmt.Errorf("kube: the pod and PVC watches of namespace %s did not sync (is the API server reachable, and may this identity list and watch pods and PVCs there?)", opts.Namespace)
	}
	return d, nil
}

// Close stops the informers and closes spare attaches.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		close(d.stopCh)
		d.spares.CloseAll()
	})
	return nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return "kube" }

// Namespace is where the driver's pods and PVCs live.
func (d *Driver) Namespace() string { return d.opts.Namespace }

func (d *Driver) notify() {
	d.changeMu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.changeMu.Unlock()
}

// waitFor re-evaluates cond on every informer change, and every recheck when it is not zero,
// until cond reports done, returns an error, or ctx ends. cond reads the informer caches.
func (d *Driver) waitFor(ctx context.Context, recheck time.Duration, cond func() (bool, error)) error {
	var tick <-chan time.Time
	if recheck > 0 {
		t := time.NewTicker(recheck)
		defer t.Stop()
		tick = t.C
	}
	for {
		d.changeMu.Lock()
		ch := d.changed
		d.changeMu.Unlock()
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ch:
		case <-tick:
		case <-ctx.Done():
			return ctx.Err()
		case <-d.stopCh:
			return errors.New("kube: driver closed")
		}
	}
}

// Check implements runtime.Driver: the watches are synced and the API server answers a list
// of the namespace's pods (which also checks this identity's access).
func (d *Driver) Check(ctx context.Context) error {
	for _, s := range d.synced {
		if !s() {
			return errors.New("kube: the pod and PVC watches are not synced")
		}
	}
	_, err := d.cs.CoreV1().Pods(d.opts.Namespace).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: LabelManagedBy + "=" + managedBy})
	if err != nil {
		return fmt.Errorf("kube: list pods in %s: %w", d.opts.Namespace, err)
	}
	return nil
}

// Create implements runtime.Driver: the PVC (with the record), then the pod; it returns once
// the guest init answers an attach. On failure it deletes what it made.
func (d *Driver) Create(ctx context.Context, rec runtime.Record) (err error) {
	name, err := ObjectName(rec.ID)
	if err != nil {
		return fmt.Errorf("kube: create: invalid box id %q", rec.ID)
	}
	pvc, err := d.set.newPVC(name, rec)
	if err != nil {
		return fmt.Errorf("kube: create %s: %w", rec.ID, err)
	}
	if _, err := admitFence(ctx, pvc); err != nil {
		return fmt.Errorf("kube: create %s: %w", rec.ID, err)
	}
	pod, err := d.set.newPod(name, rec)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: box %s: %w", rec.ID, runtime.ErrExists)
		}
		return fmt.Errorf("kube: create PVC %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if derr := d.Delete(cctx, rec.ID); derr != nil {
				d.log.Error("cleanup after a failed create", "box", rec.ID, "err", derr)
			}
		}
	}()
	if err := d.runPod(ctx, rec.ID, name, pod); err != nil {
		return err
	}
	d.log.Debug("box created", "box", rec.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// runPod creates the pod, waits for it to run and for the guest init to answer, and keeps that
// first attach as the box's spare. An old pod of the same name must be gone.
func (d *Driver) runPod(ctx context.Context, id, name string, pod *corev1.Pod) error {
	created, err := d.cs.CoreV1().Pods(d.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kube: create pod %s: %w", name, err)
	}
	if err := d.waitRunning(ctx, id, name, created.UID); err != nil {
		return err
	}
	key, err := podChannelKey(pod)
	if err != nil {
		return err
	}
	rwc, err := d.attach(ctx, id, name, key)
	if err != nil {
		return fmt.Errorf("kube: box %s: the guest init does not answer: %w", id, err)
	}
	d.spares.Keep(id, rwc)
	return nil
}

// waitRunning waits on the pod watch until the pod of that uid runs with its container ready,
// and the PVC is in the cache too (so List sees the box). It fails early, saying why, when the
// pod cannot run: unschedulable for longer than UnschedulableTimeout, an image that cannot be
// pulled or started, a container or init container that ended.
func (d *Driver) waitRunning(ctx context.Context, id, name string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	var last string
	var unschedSince time.Time
	// An unschedulable pod brings no watch event to time it out with: recheck every second.
	err := d.waitFor(ctx, time.Second, func() (bool, error) {
		pod, err := d.pods.Get(name)
		if apierrors.IsNotFound(err) {
			last = "the pod is not in the watch yet"
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if pod.UID != uid {
			last = "an older pod of the same name is still there"
			return false, nil
		}
		if pod.DeletionTimestamp != nil {
			return false, fmt.Errorf("kube: box %s: the pod was deleted while starting", id)
		}
		if why := podCannotRun(pod); why != "" {
			return false, &runtime.StartError{Reason: why}
		}
		if msg, ok := unschedulable(pod); ok {
			if unschedSince.IsZero() {
				unschedSince = time.Now()
			}
			last = "the pod cannot be scheduled: " + msg
			if time.Since(unschedSince) > d.opts.UnschedulableTimeout {
				return false, &runtime.StartError{Reason: last}
			}
			return false, nil
		}
		unschedSince = time.Time{}
		if !podReady(pod) {
			last = "the pod is " + strings.ToLower(string(pod.Status.Phase)) + waitingReason(pod)
			return false, nil
		}
		if _, err := d.pvcs.Get(name); err != nil {
			last = "the PVC is not in the watch yet"
			return false, nil
		}
		return true, nil
	})
	if err != nil && ctx.Err() != nil && !errors.As(err, new(*runtime.StartError)) {
		return &runtime.StartError{Reason: fmt.Sprintf("the pod did not run within %v: %s", d.opts.ReadyTimeout, last)}
	}
	return err
}

// Start implements runtime.Driver: a new pod on the kept PVC. fresh is always false: the
// workspace is the PVC, which lives as long as the box.
func (d *Driver) Start(ctx context.Context, id string) (bool, error) {
	name, err := ObjectName(id)
	if err != nil {
		return false, err
	}
	pvc, err := d.getPVC(ctx, id, name)
	if err != nil {
		return false, err
	}
	if pvc, err = d.fence(ctx, id, name, pvc); err != nil {
		return false, err
	}
	rec, err := decodeRecord(pvc.Labels, pvc.Annotations)
	if err != nil {
		return false, fmt.Errorf("kube: box %s: %w", id, err)
	}
	if pod, err := d.pods.Get(name); err == nil {
		_, keyErr := podChannelKey(pod)
		if pod.DeletionTimestamp == nil && podReady(pod) && pvc.Annotations[AnnCompute] == computeRunning && keyErr == nil {
			return false, nil
		}
		// A failed, pending or terminating pod of an earlier life: replace it.
		if err := d.deletePod(ctx, name, 0); err != nil {
			return false, err
		}
	}
	if err := d.setCompute(ctx, id, name, computeRunning); err != nil {
		return false, err
	}
	pod, err := d.set.newPod(name, rec)
	if err != nil {
		return false, err
	}
	if err := d.runPod(ctx, id, name, pod); err != nil {
		// Leave no pod half started: the box is stopped again (the domain decides its state).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := d.setCompute(cctx, id, name, computeStopped); derr != nil {
			d.log.Error("cleanup after a failed start", "box", id, "err", derr)
		}
		if derr := d.deletePod(cctx, name, 0); derr != nil {
			d.log.Error("cleanup after a failed start", "box", id, "err", derr)
		}
		return false, err
	}
	return false, nil
}

// Stop implements runtime.Driver: it marks the box stopped and deletes its pod, waiting until
// the pod is gone. The PVC and record stay.
func (d *Driver) Stop(ctx context.Context, id string) error {
	name, err := ObjectName(id)
	if err != nil {
		return err
	}
	pvc, err := d.getPVC(ctx, id, name)
	if err != nil {
		return err
	}
	if _, err := d.fence(ctx, id, name, pvc); err != nil {
		return err
	}
	d.spares.Drop(id)
	if err := d.setCompute(ctx, id, name, computeStopped); err != nil {
		return err
	}
	return d.deletePod(ctx, name, terminationGraceSc)
}

// Delete implements runtime.Driver: the pod (at once) and the PVC. It returns once the watch
// shows the PVC gone or terminating (Get and List then no longer see the box).
func (d *Driver) Delete(ctx context.Context, id string) error {
	name, err := ObjectName(id)
	if err != nil {
		return nil
	}
	if _, err := d.fence(ctx, id, name, nil); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return err
	}
	d.spares.Drop(id)
	zero := int64(0)
	err = d.cs.CoreV1().Pods(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: delete pod %s: %w", name, err)
	}
	err = d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: delete PVC %s: %w", name, err)
	}
	return d.waitFor(ctx, 0, func() (bool, error) {
		pvc, err := d.pvcs.Get(name)
		return apierrors.IsNotFound(err) || (err == nil && pvc.DeletionTimestamp != nil), nil
	})
}

// deletePod deletes a pod and waits on the watch until it is gone.
func (d *Driver) deletePod(ctx context.Context, name string, grace int64) error {
	err := d.cs.CoreV1().Pods(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: delete pod %s: %w", name, err)
	}
	return d.waitFor(ctx, 0, func() (bool, error) {
		_, err := d.pods.Get(name)
		return apierrors.IsNotFound(err), nil
	})
}

// setCompute records whether the box's pod should exist (a fenced write, like every write to
// the PVC but the record of a tampered channel).
func (d *Driver) setCompute(ctx context.Context, id, name, v string) error {
	_, err := d.updatePVC(ctx, id, name, func(pvc *corev1.PersistentVolumeClaim) error {
		if _, err := admitFence(ctx, pvc); err != nil {
			return fmt.Errorf("kube: box %s: %w", id, err)
		}
		pvc.Annotations[AnnCompute] = v
		if v == computeRunning {
			delete(pvc.Annotations, AnnTampered) // a new pod, with a new channel key
		}
		return nil
	})
	return err
}

// getPVC reads a box's PVC from the API server. A PVC being deleted is a deleted box.
func (d *Driver) getPVC(ctx context.Context, id, name string) (*corev1.PersistentVolumeClaim, error) {
	pvc, err := d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && (pvc.DeletionTimestamp != nil || pvc.Labels[LabelSandboxID] != id)) {
		return nil, fmt.Errorf("kube: box %s: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: get PVC %s: %w", name, err)
	}
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	return pvc, nil
}

// errUnchanged tells updatePVC that fn left the PVC as it was: nothing is written.
var errUnchanged = errors.New("kube: unchanged")

// fence admits a write to box id made with ctx (runtime.WithFence) before the write changes
// anything: a fence lower than the PVC's sandboxd.io/fence is ErrFenced; a higher one is
// written to the PVC first, on the resourceVersion of the read it was compared with (on a
// conflict the PVC is read and compared again), so every later write of an older holder is
// refused. pvc, when not nil, is a fresh read of the PVC that spares a GET when the fence is
// recorded already; the PVC as it is after the check is returned.
func (d *Driver) fence(ctx context.Context, id, name string, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	if _, ok := runtime.FenceFrom(ctx); !ok {
		return pvc, nil
	}
	if pvc != nil {
		if _, raised, err := runtime.AdmitFence(ctx, fenceOf(pvc)); err != nil {
			return nil, fmt.Errorf("kube: box %s: %w", id, err)
		} else if !raised {
			return pvc, nil
		}
	}
	var seen *corev1.PersistentVolumeClaim
	out, err := d.updatePVC(ctx, id, name, func(p *corev1.PersistentVolumeClaim) error {
		raised, err := admitFence(ctx, p)
		if err != nil {
			return fmt.Errorf("kube: box %s: %w", id, err)
		}
		if !raised {
			seen = p
			return errUnchanged
		}
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return seen, nil
	}
	return out, err
}

// updatePVC applies fn to the box's PVC and writes it, again with a fresh read on a conflict
// (another replica, or another goroutine, wrote in between) until ctx ends.
func (d *Driver) updatePVC(ctx context.Context, id, name string, fn func(*corev1.PersistentVolumeClaim) error) (*corev1.PersistentVolumeClaim, error) {
	for attempt := 0; ; attempt++ {
		pvc, err := d.getPVC(ctx, id, name)
		if err != nil {
			return nil, err
		}
		if err := fn(pvc); err != nil {
			return nil, err
		}
		out, err := d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Update(ctx, pvc, metav1.UpdateOptions{})
		if err == nil {
			return out, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("kube: update PVC %s: %w", name, err)
		}
		// Jittered, growing to 100 ms: writers that collided do not collide again in step.
		wait := time.Duration(rand.Int64N(int64(min(time.Millisecond<<min(attempt, 7), 100*time.Millisecond)) + 1))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, fmt.Errorf("kube: update PVC %s: %w (last: %v)", name, ctx.Err(), err)
		}
	}
}

// UpdateRecord implements runtime.Driver: read, check the fence, apply, write with the read's
// resourceVersion (the record and a raised fence together), again on a conflict (optimistic
// concurrency across replicas).
func (d *Driver) UpdateRecord(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	name, err := ObjectName(id)
	if err != nil {
		return runtime.Record{}, err
	}
	var rec runtime.Record
	_, err = d.updatePVC(ctx, id, name, func(pvc *corev1.PersistentVolumeClaim) error {
		r, err := decodeRecord(pvc.Labels, pvc.Annotations)
		if err != nil {
			return fmt.Errorf("kube: box %s: %w", id, err)
		}
		if _, err := admitFence(ctx, pvc); err != nil {
			return fmt.Errorf("kube: box %s: %w", id, err)
		}
		if err := fn(&r); err != nil {
			return err
		}
		if r.ID != id {
			return fmt.Errorf("kube: box %s: an update may not change the id", id)
		}
		rec = r
		return encodeRecord(pvc.Annotations, r)
	})
	if err != nil {
		return runtime.Record{}, err
	}
	return rec, nil
}

// Get implements runtime.Driver: the record from the API server, the phase from the pod watch.
func (d *Driver) Get(ctx context.Context, id string) (runtime.Box, error) {
	name, err := ObjectName(id)
	if err != nil {
		return runtime.Box{}, err
	}
	pvc, err := d.getPVC(ctx, id, name)
	if err != nil {
		return runtime.Box{}, err
	}
	return d.box(pvc)
}

// List implements runtime.Driver: every box of the namespace, from the watches' caches.
func (d *Driver) List(ctx context.Context) ([]runtime.Box, error) {
	pvcs, err := d.pvcs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(pvcs, func(a, b *corev1.PersistentVolumeClaim) int { return strings.Compare(a.Name, b.Name) })
	boxes := make([]runtime.Box, 0, len(pvcs))
	for _, pvc := range pvcs {
		if pvc.DeletionTimestamp != nil || pvc.Labels[LabelSandboxID] == "" {
			continue
		}
		b, err := d.box(pvc)
		if err != nil {
			d.log.Warn("skipping a PVC whose record cannot be read", "pvc", pvc.Name, "err", err)
			continue
		}
		boxes = append(boxes, b)
	}
	return boxes, nil
}

// box is a PVC's record with the phase its pod shows.
func (d *Driver) box(pvc *corev1.PersistentVolumeClaim) (runtime.Box, error) {
	rec, err := decodeRecord(pvc.Labels, pvc.Annotations)
	if err != nil {
		return runtime.Box{}, fmt.Errorf("kube: PVC %s: %w", pvc.Name, err)
	}
	b := runtime.Box{Record: rec, Fence: fenceOf(pvc)}
	if why := pvc.Annotations[AnnTampered]; why != "" {
		b.Phase, b.Reason = runtime.PhaseFailed, why
		return b, nil
	}
	want := pvc.Annotations[AnnCompute] == computeRunning
	pod, err := d.pods.Get(pvc.Name)
	if err != nil && !apierrors.IsNotFound(err) {
		return runtime.Box{}, err
	}
	b.Phase, b.Reason, b.Lost = phase(pod, want)
	if b.Phase == runtime.PhaseRunning {
		if _, err := podChannelKey(pod); err != nil {
			// Made by a sandboxd from before channel keys: nothing can prove its init.
			b.Phase, b.Reason = runtime.PhaseFailed, "the sandbox's pod was made by an older sandboxd, whose control channel cannot be checked; start it again"
		}
	}
	return b, nil
}

// phase is what a box's pod (nil when there is none) says of its compute, given whether the
// driver wants a pod to exist. lost marks a pod taken away (deleted or evicted) rather than
// one whose sandbox ended by itself.
func phase(pod *corev1.Pod, want bool) (p runtime.Phase, reason string, lost bool) {
	switch {
	case pod == nil && want:
		return runtime.PhaseFailed, "the sandbox's pod is gone (deleted outside sandboxd, or its node was lost)", true
	case pod == nil:
		return runtime.PhaseStopped, "", false
	case !want:
		// Stopping: the pod is on its way out.
		return runtime.PhaseStopped, "", false
	case pod.DeletionTimestamp != nil:
		return runtime.PhaseFailed, "the sandbox's pod is being deleted (not by sandboxd): " + podMessage(pod), true
	case pod.Status.Phase == corev1.PodFailed && pod.Status.Reason == "Evicted":
		return runtime.PhaseFailed, "the sandbox's pod was evicted: " + pod.Status.Message, true
	}
	if why := podCannotRun(pod); why != "" {
		return runtime.PhaseFailed, why, false
	}
	if podReady(pod) {
		return runtime.PhaseRunning, "", false
	}
	return runtime.PhaseStopped, "the sandbox's pod is " + strings.ToLower(string(pod.Status.Phase)) + waitingReason(pod), false
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// unschedulable reports the scheduler's message for a pod it could not place.
func unschedulable(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// imageErrors are container waiting reasons that do not resolve by waiting.
var imageErrors = []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
	"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

// podCannotRun says why a pod will not run by itself: an image that cannot be pulled or
// started, or an init or sandbox container that ended. "" when it may yet run.
func podCannotRun(pod *corev1.Pod) string {
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return "the sandbox's pod ended: " + podMessage(pod)
	}
	check := func(kind string, statuses []corev1.ContainerStatus, images map[string]string) string {
		for _, s := range statuses {
			if w := s.State.Waiting; w != nil && slices.Contains(imageErrors, w.Reason) {
				return fmt.Sprintf("the %s %s cannot run image %q: %s: %s", kind, s.Name, images[s.Name], w.Reason, w.Message)
			}
			if t := s.State.Terminated; t != nil && (kind == "container" || t.ExitCode != 0) {
				return fmt.Sprintf("the %s %s ended: %s", kind, s.Name, terminated(t))
			}
		}
		return ""
	}
	images := map[string]string{}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		images[c.Name] = c.Image
	}
	if why := check("init container", pod.Status.InitContainerStatuses, images); why != "" {
		return why
	}
	return check("container", pod.Status.ContainerStatuses, images)
}

func terminated(t *corev1.ContainerStateTerminated) string {
	s := fmt.Sprintf("exit code %d", t.ExitCode)
	if t.Reason != "" {
		s += " (" + t.Reason + ")"
	}
	if t.Reason == "OOMKilled" {
		s += ": out of memory"
	}
	if t.Message != "" {
		s += ": " + t.Message
	}
	return s
}

// podMessage sums up why a pod ended.
func podMessage(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.State.Terminated; t != nil {
			return terminated(t)
		}
	}
	for _, s := range pod.Status.InitContainerStatuses {
		if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
			return "init container " + s.Name + ": " + terminated(t)
		}
	}
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		return strings.TrimSpace(pod.Status.Reason + " " + pod.Status.Message)
	}
	return "phase " + string(pod.Status.Phase)
}

func waitingReason(pod *corev1.Pod) string {
	for _, s := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		if w := s.State.Waiting; w != nil && w.Reason != "" {
			return " (" + s.Name + ": " + w.Reason + ")"
		}
	}
	return ""
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
	key, err := podChannelKey(pod)
	if err != nil {
		return nil, fmt.Errorf("kube: box %s: %w: %w", id, err, runtime.ErrNotRunning)
	}
	rwc, err := d.attach(ctx, id, name, key)
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
