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
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// InitImage is the image holding the static guest init at /sandbox-init, for the boxes whose
	// image does not carry it (BoxSpec.ImageHasInit false): required for those.
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
	// DNSPeer is the cluster DNS's pods, where an egress sandbox's DNS queries may go besides
	// its policy's resolver addresses; its empty fields take kube-system and k8s-app=kube-dns.
	DNSPeer DNSPeer
	// WorkspaceReader reads stopped boxes' workspaces beside them (reader.go); off when not
	// Enabled. Enabled needs InitImage.
	WorkspaceReader WorkspaceReader
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

	// copies holds the PVCs this replica last read or wrote until the watch has them.
	copies pvcCopies

	// relabels runs the claimed pool boxes' pod relabels beside the claim's next steps
	// (pool.go): the box's next UpdateRecord waits for its relabel, so the claim answers
	// once its pod is labelled, and patches of one pod never cross.
	relabels runtime.Jobs

	// spares holds, per box, the ready attach of its last create or start.
	spares runtime.Spares

	// initConnect makes every attach run the init's connect, never the connect program (the
	// benchmarks compare the two).
	initConnect bool

	closeOnce sync.Once
}

var _ runtime.Driver = (*Driver)(nil)

// New connects to the API server and starts the driver's informers, returning once their
// caches are filled.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Config == nil {
		return nil, errors.New("kube: Options.Config is required")
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
	if err := opts.DNSPeer.Validate(); err != nil {
		return nil, err
	}
	if opts.WorkspaceReader.Enabled && opts.InitImage == "" {
		return nil, errors.New("kube: the workspace reader needs Options.InitImage (the reader pod runs its init)")
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
			dnsPeer:      opts.DNSPeer.withDefaults(),
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
	seen := func(obj any) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
			d.copies.seen(pvc)
		}
	}
	if _, err := pvcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
				d.copies.forget(pvc.Name)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
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
	// Every create and start writes the box's NetworkPolicy first: a Role without it would
	// fail them all.
	_, err = d.cs.NetworkingV1().NetworkPolicies(d.opts.Namespace).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: LabelManagedBy + "=" + managedBy})
	if err != nil {
		return fmt.Errorf("kube: list NetworkPolicies in %s: %w", d.opts.Namespace, err)
	}
	return nil
}
