// Package provisioner is the test cluster's dynamic volume provisioner: host folders as
// hostPath persistent volumes, for one StorageClass.
//
// For every PVC of its class (or of no class while its class is the default one) that is
// Pending and unbound, it makes the folder <dir>/<pvc uid> and a PV "pvc-<pvc uid>" with the
// claim's requested capacity and access modes, its claimRef set to the claim, so the
// controller manager's PV binder binds them at once. When a PV it made is Released (its claim
// was deleted) and its reclaim policy is Delete, it removes the folder and deletes the PV.
// It reacts to informer events only: no polling.
package provisioner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	storagev1listers "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Name is the provisioner name the StorageClass must carry.
const Name = "sandboxd.test/hostpath"

// Annotations the provisioner and Kubernetes use.
const (
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	annDefaultClass  = "storageclass.kubernetes.io/is-default-class"
)

// Config configures a Provisioner.
type Config struct {
	Client kubernetes.Interface
	// StorageClass is the class the provisioner serves.
	StorageClass string
	// Dir is the host folder of the volumes (Dir/<pvc uid>).
	Dir string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Provisioner provisions and reclaims hostPath PVs.
type Provisioner struct {
	cfg     Config
	log     *slog.Logger
	pvcs    corev1listers.PersistentVolumeClaimLister
	pvs     corev1listers.PersistentVolumeLister
	classes storagev1listers.StorageClassLister
	queue   workqueue.TypedRateLimitingInterface[string]
	synced  []cache.InformerSynced
	factory informers.SharedInformerFactory
}

// New returns a provisioner; Run starts it.
func New(cfg Config) (*Provisioner, error) {
	if cfg.Client == nil || cfg.StorageClass == "" || cfg.Dir == "" {
		return nil, fmt.Errorf("provisioner: Client, StorageClass and Dir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	f := informers.NewSharedInformerFactory(cfg.Client, 0)
	pvcInf := f.Core().V1().PersistentVolumeClaims()
	pvInf := f.Core().V1().PersistentVolumes()
	scInf := f.Storage().V1().StorageClasses()
	p := &Provisioner{
		cfg: cfg, log: cfg.Logger.With("component", "provisioner"), factory: f,
		pvcs: pvcInf.Lister(), pvs: pvInf.Lister(), classes: scInf.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "provisioner"}),
		synced: []cache.InformerSynced{pvcInf.Informer().HasSynced, pvInf.Informer().HasSynced, scInf.Informer().HasSynced},
	}
	enqueue := func(prefix string) cache.ResourceEventHandlerFuncs {
		add := func(obj any) {
			if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
				p.queue.Add(prefix + key)
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }}
	}
	if _, err := pvcInf.Informer().AddEventHandler(enqueue("pvc/")); err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	if _, err := pvInf.Informer().AddEventHandler(enqueue("pv/")); err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	// A class made default later may make class-less claims ours: look at them all again.
	if _, err := scInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.requeueClaims() },
		UpdateFunc: func(any, any) { p.requeueClaims() },
	}); err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	return p, nil
}

func (p *Provisioner) requeueClaims() {
	pvcs, _ := p.pvcs.List(labels.Everything())
	for _, c := range pvcs {
		p.queue.Add("pvc/" + c.Namespace + "/" + c.Name)
	}
}

// Run runs the provisioner until ctx ends.
func (p *Provisioner) Run(ctx context.Context) error {
	defer p.queue.ShutDown()
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return fmt.Errorf("provisioner: caches did not sync: %w", ctx.Err())
	}
	p.log.Info("provisioner running", "class", p.cfg.StorageClass, "dir", p.cfg.Dir)
	go func() {
		for p.next(ctx) {
		}
	}()
	<-ctx.Done()
	return nil
}

func (p *Provisioner) next(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	var err error
	switch {
	case strings.HasPrefix(key, "pvc/"):
		err = p.syncClaim(ctx, strings.TrimPrefix(key, "pvc/"))
	case strings.HasPrefix(key, "pv/"):
		err = p.syncVolume(ctx, strings.TrimPrefix(key, "pv/"))
	}
	if err != nil {
		p.log.Warn("sync failed, retrying", "key", key, "err", err)
		p.queue.AddRateLimited(key)
		return true
	}
	p.queue.Forget(key)
	return true
}

// ours reports whether a claim is of the provisioner's class.
func (p *Provisioner) ours(c *corev1.PersistentVolumeClaim) bool {
	if c.Spec.StorageClassName != nil {
		return *c.Spec.StorageClassName == p.cfg.StorageClass
	}
	sc, err := p.classes.Get(p.cfg.StorageClass)
	return err == nil && sc.Annotations[annDefaultClass] == "true"
}

// syncClaim provisions a PV for a pending claim of the class.
func (p *Provisioner) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	c, err := p.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || c.DeletionTimestamp != nil || !p.ours(c) {
		return nil
	}
	if c.Spec.Selector != nil {
		p.log.Info("claim has a selector: not provisioning", "claim", key)
		return nil
	}
	pvName := "pvc-" + string(c.UID)
	if _, err := p.pvs.Get(pvName); err == nil {
		return nil
	}
	size, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		size = resource.MustParse("1Gi")
	}
	modes := c.Spec.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	dir := filepath.Join(p.cfg.Dir, string(c.UID))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("volume folder: %w", err)
	}
	// World-writable like an emptyDir, for containers that do not run as root.
	if err := os.Chmod(dir, 0o777); err != nil {
		return fmt.Errorf("volume folder: %w", err)
	}
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        pvName,
			Annotations: map[string]string{annProvisionedBy: Name},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   modes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              p.cfg.StorageClass,
			VolumeMode:                    c.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType},
			},
		},
	}
	if sc, err := p.classes.Get(p.cfg.StorageClass); err == nil && sc.ReclaimPolicy != nil {
		pv.Spec.PersistentVolumeReclaimPolicy = *sc.ReclaimPolicy
	}
	_, err = p.cfg.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // made on an earlier event the lister had not seen yet
	}
	if err != nil {
		return fmt.Errorf("create PV %s: %w", pvName, err)
	}
	p.log.Info("provisioned", "claim", key, "pv", pvName, "size", size.String(), "dir", dir)
	return nil
}

// syncVolume reclaims a Released PV the provisioner made (reclaim policy Delete).
func (p *Provisioner) syncVolume(ctx context.Context, name string) error {
	pv, err := p.pvs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pv.Annotations[annProvisionedBy] != Name || pv.DeletionTimestamp != nil ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		(pv.Status.Phase != corev1.VolumeReleased && pv.Status.Phase != corev1.VolumeFailed) {
		return nil
	}
	if pv.Spec.HostPath != nil {
		dir := filepath.Clean(pv.Spec.HostPath.Path)
		// Only ever remove a folder of the provisioner's own.
		if filepath.Dir(dir) != filepath.Clean(p.cfg.Dir) {
			return fmt.Errorf("PV %s: path %s is not under %s: not removing it", name, dir, p.cfg.Dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("PV %s: remove %s: %w", name, dir, err)
		}
	}
	err = p.cfg.Client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete PV %s: %w", name, err)
	}
	p.log.Info("reclaimed", "pv", name)
	return nil
}

// EnsureStorageClass creates the provisioner's StorageClass (default class, Immediate
// binding, reclaim Delete) unless it exists.
func EnsureStorageClass(ctx context.Context, client kubernetes.Interface, name string) error {
	reclaim := corev1.PersistentVolumeReclaimDelete
	mode := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name, Annotations: map[string]string{annDefaultClass: "true"}},
		Provisioner:       Name,
		ReclaimPolicy:     &reclaim,
		VolumeBindingMode: &mode,
	}
	_, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create storage class %s: %w", name, err)
	}
	return nil
}
