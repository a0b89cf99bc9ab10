// Package provider is the virtual-kubelet provider of the test cluster's node: it runs pod
// containers as real gVisor containers with runsc on this host, or, for pods whose
// RuntimeClass has handler runc, as native containers with runc (package engine; see
// runtime.go).
//
// Each container is its own runsc sandbox or runc container (one `create` + `start`),
// created from an OCI bundle over a local rootfs folder that stands for the container's image
// (the node's --image NAME=DIR map). Pod volumes are host folders bind-mounted into every container that
// mounts them: emptyDir (a folder per pod), persistentVolumeClaim (the bound PV's hostPath or
// local path), hostPath, and configMap/secret/downwardAPI/projected (files written by the
// node). Init containers run one by one to completion, then the containers start.
//
// Everything of a pod lives under DataDir/pods/<pod uid>/:
//
//	volumes/<name>/                   emptyDir and the files of configMap/secret/projected volumes
//	containers/<name>/config.json     the container's OCI bundle
//	logs/<name>.log                   the container's stdout and stderr (GetContainerLogs)
//
// Status is pushed to virtual-kubelet through the NotifyPods callback whenever it changes. A
// container's exit is reported by its shim (package shim), the parent of its sandbox process,
// with the exit status and the memory cgroup's OOM verdict: no polling. Only if a shim is
// killed itself is the container's liveness checked every 200 ms (runsc: state file pid and
// /proc; runc: `runc state`).
package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"sandboxd/tests/kubeenv/internal/engine"
	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// Config configures a Provider.
type Config struct {
	// NodeName is the node's name (for logs and the stats summary).
	NodeName string
	// DataDir holds the pods' folders (DataDir/pods).
	DataDir string
	// Runsc runs runsc with the node's root folder and global flags: the runtime of pods
	// without a RuntimeClass and of RuntimeClass handler runsc.
	Runsc *runsc.CLI
	// Runc runs runc with the node's root folder and cgroup parent: the runtime of
	// RuntimeClass handler runc. Optional: without it such pods fail.
	Runc *runc.CLI
	// Self is the node's binary: each container's shim runs it (`Self shim …`, package shim).
	Self string
	// Images maps an image name (as written in pod specs) to a local rootfs folder.
	Images map[string]string
	// Client reads PVCs, PVs, configMaps and secrets, requests service account tokens and
	// deletes pods whose containers are gone.
	Client kubernetes.Interface
	// Pods is virtual-kubelet's pod lister (pods of this node); optional. It tells a pod that
	// was recreated under the same name (a new uid) from the one the provider still runs.
	Pods corev1listers.PodLister
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Provider implements virtual-kubelet's nodeutil.Provider and node.PodNotifier (an async
// provider: status changes are pushed, never polled by virtual-kubelet).
type Provider struct {
	cfg     Config
	log     *slog.Logger
	podsDir string
	start   time.Time

	mu   sync.Mutex
	pods map[string]*podRuntime // by namespace/name
	// gone remembers the uids of pods torn down lately: virtual-kubelet may ask to delete
	// one again, which is then a success, not a "not found" (it would record a warning event).
	gone map[types.UID]time.Time
	// closed is set by Shutdown: no pod is created after it.
	closed bool

	// engines are the runtimes by RuntimeClass handler (runsc, and runc when configured).
	engines map[string]engine.Engine

	notifyMu sync.RWMutex
	notify   func(*corev1.Pod)

	// wg counts the goroutines of pods (runners, exit watchers, teardowns).
	wg sync.WaitGroup
}

// New returns a provider over cfg, creating its folders. Call Cleanup first to remove what
// an earlier run of the node left.
func New(cfg Config) (*Provider, error) {
	if cfg.Runsc == nil || cfg.Client == nil || cfg.DataDir == "" || cfg.Self == "" {
		return nil, errors.New("provider: Runsc, Client, DataDir and Self are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for name, dir := range cfg.Images {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("provider: image %s: rootfs %q is not a folder", name, dir)
		}
		if !filepath.IsAbs(dir) || filepath.Clean(dir) == "/" {
			return nil, fmt.Errorf("provider: image %s: rootfs %q must be an absolute path other than /", name, dir)
		}
	}
	p := &Provider{
		cfg:     cfg,
		log:     cfg.Logger,
		podsDir: filepath.Join(cfg.DataDir, "pods"),
		start:   time.Now(),
		pods:    map[string]*podRuntime{},
		gone:    map[types.UID]time.Time{},
		engines: engines(cfg),
	}
	dirs := []string{p.podsDir}
	for _, e := range p.engines {
		dirs = append(dirs, e.Root())
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("provider: %w", err)
		}
	}
	return p, nil
}

// engines returns the configured runtimes by handler.
func engines(cfg Config) map[string]engine.Engine {
	m := map[string]engine.Engine{engine.Runsc: engine.NewRunsc(cfg.Runsc)}
	if cfg.Runc != nil {
		m[engine.Runc] = engine.NewRunc(cfg.Runc)
	}
	return m
}

// Cleanup destroys every container in the node's runsc and runc roots, unmounts what is left
// mounted in the pods' folders (runc containers' overlay roots) and removes those folders:
// what a node that died without shutting down left behind. cfg needs DataDir, Runsc and Runc
// (when configured).
func Cleanup(ctx context.Context, cfg Config) error {
	for _, e := range engines(cfg) {
		ids, err := e.DestroyAll(ctx)
		if err != nil {
			return fmt.Errorf("provider: remove leftover %s containers: %w", e.Handler(), err)
		}
		if len(ids) > 0 {
			slog.Info("removed leftover containers", "runtime", e.Handler(), "count", len(ids))
		}
	}
	podsDir := filepath.Join(cfg.DataDir, "pods")
	if err := runc.UnmountUnder(podsDir); err != nil {
		return fmt.Errorf("provider: unmount leftovers in the pod folders: %w", err)
	}
	if err := os.RemoveAll(podsDir); err != nil {
		return fmt.Errorf("provider: remove leftover pod folders: %w", err)
	}
	return nil
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// lookup returns the provider's pod of that name, or nil.
func (p *Provider) lookup(namespace, name string) *podRuntime {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[podKey(namespace, name)]
}

// stale reports whether Kubernetes has a pod of that name with another uid than pr: the
// pod was deleted and recreated and pr is the old one, whatever its own state.
func (p *Provider) stale(pr *podRuntime) bool {
	if p.cfg.Pods == nil {
		return false
	}
	kp, err := p.cfg.Pods.Pods(pr.namespace).Get(pr.name)
	return err == nil && kp.UID != pr.uid
}

// CreatePod implements node.PodLifecycleHandler. It records the pod and returns; the pod's
// volumes and containers are set up by a goroutine that reports through NotifyPods.
func (p *Provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	// A pod of that name still torn down (deleted and recreated at once): wait for it, so
	// the two never share the name's folders or race on a PVC.
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return fmt.Errorf("pod %s: the node is shutting down", key)
		}
		old := p.pods[key]
		if old == nil {
			break
		}
		p.mu.Unlock()
		if old.uid == pod.UID {
			return nil // already running it
		}
		old.beginTeardown(0)
		select {
		case <-old.gone:
		case <-ctx.Done():
			return fmt.Errorf("pod %s: waiting for the previous pod of that name to go: %w", key, ctx.Err())
		}
	}
	pr := newPodRuntime(p, pod)
	p.pods[key] = pr
	p.mu.Unlock()

	p.log.Info("pod created", "pod", key, "uid", pod.UID)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		pr.run()
	}()
	return nil
}

// UpdatePod implements node.PodLifecycleHandler: labels and annotations are recorded; a
// changed image does not restart anything.
func (p *Provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	pr := p.lookup(pod.Namespace, pod.Name)
	if pr == nil || pr.uid != pod.UID {
		return errdefs.NotFoundf("pod %s/%s is not known to this node", pod.Namespace, pod.Name)
	}
	pr.update(pod)
	return nil
}

// DeletePod implements node.PodLifecycleHandler. It starts the teardown and returns: the
// containers get SIGTERM and the pod's grace period (none with grace 0), then they are
// killed and deleted, the pod's folders removed, the terminal status pushed, and the pod
// deleted from Kubernetes as a kubelet does once its containers are gone.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	pr := p.lookup(pod.Namespace, pod.Name)
	if pr == nil || (pod.UID != "" && pr.uid != pod.UID) {
		p.mu.Lock()
		_, done := p.gone[pod.UID]
		p.mu.Unlock()
		if done {
			return nil
		}
		return errdefs.NotFoundf("pod %s/%s is not known to this node", pod.Namespace, pod.Name)
	}
	var grace time.Duration
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	pr.beginTeardown(grace)
	return nil
}

// GetPod implements node.PodLifecycleHandler.
func (p *Provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	pr := p.lookup(namespace, name)
	if pr == nil || p.stale(pr) {
		return nil, errdefs.NotFoundf("pod %s/%s is not known to this node", namespace, name)
	}
	return pr.snapshot(), nil
}

// GetPodStatus implements node.PodLifecycleHandler.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods implements node.PodLifecycleHandler.
func (p *Provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	prs := make([]*podRuntime, 0, len(p.pods))
	for _, pr := range p.pods {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(prs))
	for _, pr := range prs {
		pods = append(pods, pr.snapshot())
	}
	return pods, nil
}

// NotifyPods implements node.PodNotifier.
func (p *Provider) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	p.notifyMu.Lock()
	p.notify = cb
	p.notifyMu.Unlock()
}

// push hands a pod's status to virtual-kubelet.
func (p *Provider) push(pod *corev1.Pod) {
	p.notifyMu.RLock()
	cb := p.notify
	p.notifyMu.RUnlock()
	if cb != nil {
		cb(pod)
	}
}

// forget removes pr from the pod map (if it is still the pod of its name).
func (p *Provider) forget(pr *podRuntime) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods[pr.key] == pr {
		delete(p.pods, pr.key)
	}
	now := time.Now()
	for uid, t := range p.gone {
		if now.Sub(t) > goneTTL {
			delete(p.gone, uid)
		}
	}
	p.gone[pr.uid] = now
}

// goneTTL is how long the uid of a torn-down pod is remembered.
const goneTTL = 10 * time.Minute

// deleteFromAPI deletes a terminated pod from Kubernetes (grace 0, only that uid), as the
// kubelet does once a deleted pod's containers are gone. Pods not being deleted are left.
func (p *Provider) deleteFromAPI(ctx context.Context, pr *podRuntime) {
	pods := p.cfg.Client.CoreV1().Pods(pr.namespace)
	kp, err := pods.Get(ctx, pr.name, metav1.GetOptions{})
	if err != nil || kp.UID != pr.uid || kp.DeletionTimestamp == nil {
		return
	}
	uid := pr.uid
	opts := metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}}
	if err := pods.Delete(ctx, pr.name, opts); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("delete terminated pod from the API", "pod", pr.key, "err", err)
	}
}

// Shutdown tears every pod down at once (grace 0) and waits for it, then destroys whatever
// runsc or runc container is left in the node's roots. The node calls it when it stops.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	prs := make([]*podRuntime, 0, len(p.pods))
	for _, pr := range p.pods {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	for _, pr := range prs {
		pr.beginTeardown(0)
	}
	for _, pr := range prs {
		select {
		case <-pr.gone:
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	var errs []error
	for _, e := range p.engines {
		if _, err := e.DestroyAll(context.WithoutCancel(ctx)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// GetContainerLogs implements nodeutil.Provider: the container's log file.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pr := p.lookup(namespace, podName)
	if pr == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not known to this node", namespace, podName)
	}
	return pr.logs(ctx, containerName, opts)
}

// RunInContainer implements nodeutil.Provider: `runsc exec` or `runc exec` in the container, its stdio wired
// to the streams. A non-zero exit is returned as a k8s.io/utils/exec.CodeExitError.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	pr := p.lookup(namespace, podName)
	if pr == nil {
		return errdefs.NotFoundf("pod %s/%s is not known to this node", namespace, podName)
	}
	return pr.exec(ctx, containerName, cmd, attach)
}

// AttachToContainer implements nodeutil.Provider. Not supported: a container's stdio goes
// to its log file (runsc keeps it open), there is no process to attach to.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return errdefs.InvalidInput("attach is not supported by this node (container output goes to its log: use logs or exec)")
}

// PortForward implements nodeutil.Provider. Not supported: no container has a network
// (runsc --network=none; runc: a network namespace of its own with only loopback).
func (p *Provider) PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	return errdefs.InvalidInput("port-forward is not supported by this node (containers have no network)")
}

// GetStatsSummary implements nodeutil.Provider with a summary that lists the pods and no usage.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	pods, _ := p.GetPods(ctx)
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.cfg.NodeName, StartTime: metav1.NewTime(p.start)}}
	for _, pod := range pods {
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{
			PodRef:    statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)},
			StartTime: metav1.NewTime(pod.CreationTimestamp.Time),
		})
	}
	return s, nil
}

// GetMetricsResource implements nodeutil.Provider: no metrics.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}
