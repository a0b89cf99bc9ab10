package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"sandboxd/tests/kubeenv/internal/engine"
	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
	"sandboxd/tests/kubeenv/internal/shim"
)

// Container state reasons, as the kubelet reports them.
const (
	reasonPodInitializing   = "PodInitializing"
	reasonContainerCreating = "ContainerCreating"
	reasonErrImageNeverPull = "ErrImageNeverPull"
	reasonCreateConfigError = "CreateContainerConfigError"
	reasonCreateError       = "CreateContainerError"
	reasonCompleted         = "Completed"
	reasonError             = "Error"
	reasonOOMKilled         = "OOMKilled"
)

// teardownTimeout bounds the teardown of a pod after its grace period.
const teardownTimeout = 30 * time.Second

// livenessPoll is how often a container whose shim left no exit status is checked until its
// process is gone (normally it already is).
const livenessPoll = 200 * time.Millisecond

// podRuntime is one pod on the node: its folders, its containers and the status the node
// reports for it.
type podRuntime struct {
	p                    *Provider
	key, namespace, name string
	uid                  types.UID
	dir                  string

	// ctx is cancelled when the teardown begins: it stops the runner.
	ctx    context.Context
	cancel context.CancelFunc
	// runDone is closed when the runner returned; gone when the teardown finished.
	runDone      chan struct{}
	gone         chan struct{}
	teardownOnce sync.Once

	// pushMu keeps pushes in order: a status is snapshotted and handed over under it.
	pushMu sync.Mutex

	mu           sync.Mutex
	pod          *corev1.Pod   // spec and metadata; the status is built from the fields below
	eng          engine.Engine // the pod's runtime (by its RuntimeClass); set before any container
	ctrs         []*ctr        // init containers, then containers, in spec order
	byName       map[string]*ctr
	volumes      map[string]hostVolume
	startTime    *metav1.Time
	sandboxReady bool
	failReason   string
	failMessage  string
	deleting     bool
	conds        map[corev1.PodConditionType]corev1.PodCondition
}

// ctr is one container of a pod.
type ctr struct {
	spec    corev1.Container
	init    bool
	id      string // container id: fixed length, never a prefix of another (runsc matches prefixes)
	logPath string
	bundle  string
	// created is set before the bundle is prepared (runc mounts its root there) and stays
	// set: the teardown destroys the container (a no-op when there is none).
	created bool
	// exited is closed once the container's exit was recorded (state terminated).
	exited  chan struct{}
	started bool
	state   corev1.ContainerState
}

func newPodRuntime(p *Provider, pod *corev1.Pod) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &podRuntime{
		p: p, key: podKey(pod.Namespace, pod.Name), namespace: pod.Namespace, name: pod.Name, uid: pod.UID,
		dir:     filepath.Join(p.podsDir, string(pod.UID)),
		ctx:     ctx,
		cancel:  cancel,
		runDone: make(chan struct{}),
		gone:    make(chan struct{}),
		pod:     pod.DeepCopy(),
		byName:  map[string]*ctr{},
		conds:   map[corev1.PodConditionType]corev1.PodCondition{},
	}
	add := func(c corev1.Container, init bool) {
		k := &ctr{spec: c, init: init, id: containerID(pod.UID, c.Name), exited: make(chan struct{})}
		k.logPath = filepath.Join(pr.dir, "logs", c.Name+".log")
		k.bundle = filepath.Join(pr.dir, "containers", c.Name)
		waiting := reasonContainerCreating
		if init || len(pod.Spec.InitContainers) > 0 {
			waiting = reasonPodInitializing
		}
		k.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: waiting}}
		pr.ctrs = append(pr.ctrs, k)
		pr.byName[c.Name] = k
	}
	for _, c := range pod.Spec.InitContainers {
		add(c, true)
	}
	for _, c := range pod.Spec.Containers {
		add(c, false)
	}
	return pr
}

// containerID is the runsc id of a pod's container: "kv" and 30 hex digits of a hash of the
// pod uid and the container name. Fixed length, so never the prefix of another id.
func containerID(uid types.UID, name string) string {
	sum := sha256.Sum256([]byte(string(uid) + "/" + name))
	return "kv" + hex.EncodeToString(sum[:])[:runsc.MaxIDLen-2]
}

// update records what may change on a running pod (labels, annotations, images).
func (pr *podRuntime) update(pod *corev1.Pod) {
	pr.mu.Lock()
	pr.pod.Labels = pod.Labels
	pr.pod.Annotations = pod.Annotations
	pr.pod.Spec.Containers = pod.Spec.Containers
	pr.pod.Spec.InitContainers = pod.Spec.InitContainers
	pr.pod.Spec.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	pr.pod.Spec.Tolerations = pod.Spec.Tolerations
	pr.mu.Unlock()
}

// run sets the pod up: images, volumes, init containers to completion, then the containers.
// Every step ends in a pushed status; a failure ends the pod (phase Failed) except an
// unknown image, which leaves it Pending with the container waiting, as the kubelet does
// for an image it must not pull.
func (pr *podRuntime) run() {
	defer close(pr.runDone)
	ctx := pr.ctx
	now := metav1.Now()
	pr.mu.Lock()
	pr.startTime = &now
	class := pr.pod.Spec.RuntimeClassName
	pr.mu.Unlock()

	// The runtime first, as a kubelet creates the pod's sandbox before pulling images.
	eng, msg := pr.p.engineFor(ctx, class)
	if eng == nil {
		if ctx.Err() == nil {
			pr.fail(nil, reasonSandboxCreate, msg)
		}
		return
	}
	pr.mu.Lock()
	pr.eng = eng
	pr.mu.Unlock()

	for _, c := range pr.ctrs {
		if _, ok := pr.p.image(c.spec.Image); !ok {
			pr.setWaiting(c, reasonErrImageNeverPull, fmt.Sprintf("image %q is not known to this node (known: %s)", c.spec.Image, pr.p.imageNames()))
			pr.push()
			return
		}
		if len(c.spec.Command) == 0 {
			pr.fail(c, reasonCreateConfigError, fmt.Sprintf("container %s: command is required (the images of this node have no entrypoint metadata)", c.spec.Name))
			return
		}
	}
	pr.push()
	for _, sub := range []string{"logs", "containers", "volumes"} {
		if err := os.MkdirAll(filepath.Join(pr.dir, sub), 0o755); err != nil {
			pr.fail(nil, "NodeError", fmt.Sprintf("create pod folder: %v", err))
			return
		}
	}
	vols, reason, err := pr.prepareVolumes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			pr.fail(nil, reason, err.Error())
		}
		return
	}
	pr.mu.Lock()
	pr.volumes = vols
	pr.sandboxReady = true
	pr.mu.Unlock()
	pr.push()

	for _, c := range pr.ctrs {
		if !c.init {
			continue
		}
		if err := pr.startContainer(ctx, c); err != nil {
			if ctx.Err() == nil {
				pr.fail(c, reasonCreateError, err.Error())
			}
			return
		}
		pr.push()
		select {
		case <-c.exited:
		case <-ctx.Done():
			return
		}
		pr.mu.Lock()
		code := c.state.Terminated.ExitCode
		pr.mu.Unlock()
		if code != 0 {
			pr.p.log.Info("init container failed", "pod", pr.key, "container", c.spec.Name, "exit", code)
			pr.push() // Failed: an init container exited non-zero (restartPolicy is treated as Never)
			return
		}
	}
	pr.mu.Lock()
	for _, c := range pr.ctrs {
		if !c.init && c.state.Waiting != nil {
			c.state.Waiting.Reason = reasonContainerCreating
		}
	}
	pr.mu.Unlock()
	for _, c := range pr.ctrs {
		if c.init {
			continue
		}
		if err := pr.startContainer(ctx, c); err != nil {
			if ctx.Err() == nil {
				pr.fail(c, reasonCreateError, err.Error())
			}
			return
		}
	}
	pr.push()
	pr.p.log.Info("pod running", "pod", pr.key, "ms", time.Since(now.Time).Milliseconds())
}

// image returns the rootfs folder of an image name ("name" also matches "name:latest").
func (p *Provider) image(name string) (string, bool) {
	if dir, ok := p.cfg.Images[name]; ok {
		return dir, true
	}
	if !strings.Contains(name[strings.LastIndexByte(name, '/')+1:], ":") {
		dir, ok := p.cfg.Images[name+":latest"]
		return dir, ok
	}
	return "", false
}

// imageNames lists the images the node knows, for messages.
func (p *Provider) imageNames() string {
	if len(p.cfg.Images) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(p.cfg.Images)), ", ")
}

// setWaiting sets a container's waiting state.
func (pr *podRuntime) setWaiting(c *ctr, reason, message string) {
	pr.mu.Lock()
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
	pr.mu.Unlock()
}

// fail ends the pod as Failed with a reason and message (also set as c's waiting state when
// c is not nil), destroys the containers it started and pushes the status.
func (pr *podRuntime) fail(c *ctr, reason, message string) {
	pr.p.log.Warn("pod failed", "pod", pr.key, "reason", reason, "message", message)
	pr.mu.Lock()
	pr.failReason, pr.failMessage = reason, message
	if c != nil && c.state.Terminated == nil {
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
	}
	pr.mu.Unlock()
	pr.destroyContainers(context.Background())
	pr.push()
}

// startContainer writes the container's bundle (the runtime completes it: runc gets its
// overlay root), creates the container through its shim (which stays the parent of the
// container's process and reports the exit status), starts it, and starts the goroutine that
// records its exit.
func (pr *podRuntime) startContainer(ctx context.Context, c *ctr) error {
	rootfs, _ := pr.p.image(c.spec.Image)
	pr.mu.Lock()
	spec, err := pr.buildSpec(c, rootfs)
	eng := pr.eng
	pr.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.bundle, 0o700); err != nil {
		return fmt.Errorf("container %s: bundle: %w", c.spec.Name, err)
	}
	pr.mu.Lock()
	c.created = true
	pr.mu.Unlock()
	if err := eng.Prepare(spec, c.bundle, c.id); err != nil {
		return fmt.Errorf("container %s: bundle: %w", c.spec.Name, err)
	}
	if err := writeJSON(filepath.Join(c.bundle, "config.json"), spec); err != nil {
		return fmt.Errorf("container %s: bundle: %w", c.spec.Name, err)
	}

	t0 := time.Now()
	sh, err := shim.Start(ctx, shim.Config{
		Self: pr.p.cfg.Self, Engine: eng, Bundle: c.bundle, ID: c.id, Log: c.logPath,
		StatusFile: shim.StatusPath(c.bundle), ShimLog: filepath.Join(c.bundle, "shim.log"),
	})
	if err != nil {
		return fmt.Errorf("container %s: %w", c.spec.Name, err)
	}
	t1 := time.Now()
	// O_APPEND: the sandbox writes at its own offset otherwise, overwriting earlier output.
	log, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err == nil {
		err = eng.Start(ctx, log, c.id)
		log.Close()
	}
	if err != nil {
		// The shim reports the container's end once the teardown destroys it.
		return fmt.Errorf("container %s: %w: %s", c.spec.Name, err, runsc.LogLine(c.logPath, 400))
	}
	now := metav1.Now()
	pr.mu.Lock()
	c.started = true
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	pr.mu.Unlock()
	pr.p.log.Info("container started", "pod", pr.key, "container", c.spec.Name, "id", c.id, "runtime", eng.Handler(),
		"create_ms", t1.Sub(t0).Milliseconds(), "start_ms", time.Since(t1).Milliseconds())

	pr.p.wg.Add(1)
	go func() {
		defer pr.p.wg.Done()
		pr.watch(eng, c, sh, now)
	}()
	return nil
}

// watch waits for the container to end (its shim exits then) and records its terminated
// state: the exit code, "OOMKilled" when the memory cgroup counted an OOM kill, else
// "Completed" or "Error". A container that ended on its own is then deleted (freeing its
// cgroups); the log file stays for GetContainerLogs. The pod's status is pushed.
func (pr *podRuntime) watch(eng engine.Engine, c *ctr, sh *shim.Process, startedAt metav1.Time) {
	st, err := sh.Wait()
	message := ""
	if err != nil {
		// The shim itself was killed: the container's end is seen in the runtime's state
		// (runsc: its sandbox process; runc: `runc state`).
		pr.p.log.Warn("no exit status from the shim", "pod", pr.key, "container", c.spec.Name, "err", err)
		for eng.Alive(c.id) {
			time.Sleep(livenessPoll)
		}
		st = shim.Status{ExitCode: 137}
		message = "the container's process ended; its exit status is unknown (its shim was killed)"
	}
	code, reason := st.ExitCode, reasonCompleted
	if code != 0 {
		reason = reasonError
	}
	pr.mu.Lock()
	deleting := pr.deleting
	switch {
	case st.OOMKilled:
		reason, code = reasonOOMKilled, 137
		message = "the container's memory cgroup OOM-killed its process"
	case deleting && st.Signal != 0:
		message = "killed: the pod was deleted"
	case code != 0 && message == "" && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError:
		message = runsc.LogLine(c.logPath, 2048)
	}
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Signal: int32(st.Signal), Reason: reason, Message: message,
		StartedAt: startedAt, FinishedAt: metav1.Now(), ContainerID: eng.Handler() + "://" + c.id,
	}}
	pr.mu.Unlock()
	pr.p.log.Info("container exited", "pod", pr.key, "container", c.spec.Name, "exit", code, "reason", reason)
	if !deleting {
		if err := eng.Destroy(context.Background(), c.id, c.bundle); err != nil {
			pr.p.log.Warn("delete exited container", "pod", pr.key, "container", c.spec.Name, "err", err)
		}
	}
	close(c.exited)
	if !deleting {
		pr.push()
		pr.stopOnFailure()
	}
}

// stopOnFailure ends the remaining containers of a pod that failed (a container exited
// non-zero and restartPolicy is treated as Never: the pod is Failed, nothing may run on).
func (pr *podRuntime) stopOnFailure() {
	if pr.snapshot().Status.Phase == corev1.PodFailed {
		pr.destroyContainers(context.Background())
	}
}

// beginTeardown starts tearing the pod down (once): the runner stops, the containers get
// SIGTERM and grace to exit, then are destroyed with the pod's folders.
func (pr *podRuntime) beginTeardown(grace time.Duration) {
	pr.teardownOnce.Do(func() {
		pr.mu.Lock()
		pr.deleting = true
		pr.mu.Unlock()
		pr.cancel()
		pr.p.wg.Add(1)
		go func() {
			defer pr.p.wg.Done()
			defer close(pr.gone)
			pr.teardown(grace)
		}()
	})
}

func (pr *podRuntime) teardown(grace time.Duration) {
	start := time.Now()
	<-pr.runDone
	var running []*ctr
	pr.mu.Lock()
	eng := pr.eng
	for _, c := range pr.ctrs {
		if c.started && c.state.Running != nil {
			running = append(running, c)
		}
	}
	pr.mu.Unlock()
	if grace > 0 && len(running) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		for _, c := range running {
			if err := eng.Signal(ctx, c.id, "TERM"); err != nil {
				pr.p.log.Debug("SIGTERM container", "pod", pr.key, "container", c.spec.Name, "err", err)
			}
		}
		for _, c := range running {
			select {
			case <-c.exited:
			case <-ctx.Done():
			}
		}
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	pr.destroyContainers(ctx)
	// The exit watchers end once their sandboxes are gone.
	for _, c := range pr.ctrs {
		pr.mu.Lock()
		started := c.started
		pr.mu.Unlock()
		if !started {
			continue
		}
		select {
		case <-c.exited:
		case <-ctx.Done():
			pr.p.log.Warn("container exit not seen after teardown", "pod", pr.key, "container", c.spec.Name)
		}
	}
	// Destroy unmounted the runc containers' overlay roots; never remove through a mount.
	if err := runc.UnmountUnder(pr.dir); err != nil {
		pr.p.log.Warn("unmount in pod folder", "pod", pr.key, "err", err)
	}
	if err := os.RemoveAll(pr.dir); err != nil {
		pr.p.log.Warn("remove pod folder", "pod", pr.key, "err", err)
	}
	// runsc's shared null-netns mount stays until the node shuts down (DestroyAll): unmounting
	// it whenever no container is listed races a concurrent create that already uses it but is
	// not listed yet, and that sandbox dies (seen: init containers killed, exit 137).
	pr.push()
	pr.p.forget(pr)
	pr.p.log.Info("pod deleted", "pod", pr.key, "uid", pr.uid, "grace_s", grace.Seconds(), "ms", time.Since(start).Milliseconds())
	pr.p.deleteFromAPI(ctx, pr)
}

// destroyContainers destroys every container the pod created, in parallel.
func (pr *podRuntime) destroyContainers(ctx context.Context) {
	var wg sync.WaitGroup
	pr.mu.Lock()
	ctrs := append([]*ctr(nil), pr.ctrs...)
	eng := pr.eng
	pr.mu.Unlock()
	if eng == nil {
		return // no runtime, no container
	}
	for _, c := range ctrs {
		pr.mu.Lock()
		created := c.created
		pr.mu.Unlock()
		if !created {
			continue
		}
		wg.Go(func() {
			if err := eng.Destroy(ctx, c.id, c.bundle); err != nil {
				pr.p.log.Warn("destroy container", "pod", pr.key, "container", c.spec.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// push hands the pod's current status to virtual-kubelet, in order.
func (pr *podRuntime) push() {
	// virtual-kubelet keys pods by name: the status of a pod that was replaced by a new one
	// of the same name (another uid) would land on the new one.
	if pr.p.stale(pr) {
		return
	}
	pr.pushMu.Lock()
	defer pr.pushMu.Unlock()
	pr.p.push(pr.snapshot())
}

// snapshot returns a copy of the pod with its current status.
func (pr *podRuntime) snapshot() *corev1.Pod {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pod := pr.pod.DeepCopy()
	pod.Status = pr.status()
	return pod
}

// status builds the pod's status. Called with pr.mu held.
func (pr *podRuntime) status() corev1.PodStatus {
	orig := pr.pod.Status
	st := corev1.PodStatus{
		QOSClass:  orig.QOSClass,
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		StartTime: pr.startTime,
	}
	initDone, initFailed := true, false
	mainTotal, mainRunning, mainTerminated, mainFailed := 0, 0, 0, 0
	for _, c := range pr.ctrs {
		cs := corev1.ContainerStatus{
			Name:         c.spec.Name,
			Image:        c.spec.Image,
			ImageID:      "kubeenv://" + c.spec.Image,
			State:        *c.state.DeepCopy(),
			Ready:        c.state.Running != nil,
			Started:      new(c.state.Running != nil),
			RestartCount: 0,
		}
		if c.started {
			cs.ContainerID = pr.eng.Handler() + "://" + c.id
		}
		if c.init {
			cs.Ready = c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
			cs.Started = new(c.state.Running != nil)
			if t := c.state.Terminated; t == nil || t.ExitCode != 0 {
				initDone = false
				if t != nil {
					initFailed = true
				}
			}
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
			continue
		}
		mainTotal++
		switch {
		case c.state.Running != nil:
			mainRunning++
		case c.state.Terminated != nil:
			mainTerminated++
			if c.state.Terminated.ExitCode != 0 {
				mainFailed++
			}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}

	switch {
	case pr.failReason != "":
		st.Phase, st.Reason, st.Message = corev1.PodFailed, pr.failReason, pr.failMessage
	case initFailed:
		st.Phase = corev1.PodFailed
	case !initDone:
		st.Phase = corev1.PodPending
	case mainTotal > 0 && mainTerminated == mainTotal && mainFailed == 0:
		st.Phase = corev1.PodSucceeded
	case mainTotal > 0 && mainTerminated == mainTotal:
		st.Phase = corev1.PodFailed
	case mainFailed > 0:
		// restartPolicy is treated as Never: a failed container fails the pod.
		st.Phase = corev1.PodFailed
	case mainRunning+mainTerminated == mainTotal:
		st.Phase = corev1.PodRunning
	default:
		st.Phase = corev1.PodPending
	}
	if pr.deleting && pr.isTornDown() && st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed {
		st.Phase = corev1.PodFailed
		if st.Reason == "" {
			st.Reason, st.Message = "Deleted", "the pod was deleted before its containers ran"
		}
	}

	ready := mainTotal > 0 && mainRunning == mainTotal
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	notReady := "ContainersNotReady"
	if terminal {
		notReady = "PodCompleted"
	}
	// Conditions this node does not manage (PodScheduled, DisruptionTarget, …) are kept.
	managed := map[corev1.PodConditionType]bool{
		corev1.PodReadyToStartContainers: true, corev1.PodInitialized: true,
		corev1.ContainersReady: true, corev1.PodReady: true,
	}
	for _, c := range orig.Conditions {
		if !managed[c.Type] {
			st.Conditions = append(st.Conditions, c)
		}
	}
	st.Conditions = append(st.Conditions,
		pr.condition(corev1.PodReadyToStartContainers, pr.sandboxReady && !terminal, ""),
		pr.condition(corev1.PodInitialized, initDone, pick(terminal, "PodCompleted", "ContainersNotInitialized")),
		pr.condition(corev1.ContainersReady, ready, notReady),
		pr.condition(corev1.PodReady, ready, notReady),
	)
	return st
}

// isTornDown reports whether the teardown finished destroying the containers (all started
// containers have exited). Called with pr.mu held.
func (pr *podRuntime) isTornDown() bool {
	for _, c := range pr.ctrs {
		if c.started && c.state.Terminated == nil {
			return false
		}
	}
	return true
}

// condition returns a pod condition, keeping its last transition time while its status
// does not change. Called with pr.mu held.
func (pr *podRuntime) condition(t corev1.PodConditionType, ok bool, falseReason string) corev1.PodCondition {
	status := corev1.ConditionFalse
	reason := falseReason
	if ok {
		status, reason = corev1.ConditionTrue, ""
	}
	prev, had := pr.conds[t]
	if had && prev.Status == status && prev.Reason == reason {
		return prev
	}
	c := corev1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: metav1.Now()}
	pr.conds[t] = c
	return c
}

func pick(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// container returns the pod's container of that name; "" means the only (or first) one.
func (pr *podRuntime) container(name string) (*ctr, error) {
	if name == "" {
		for _, c := range pr.ctrs {
			if !c.init {
				return c, nil
			}
		}
	}
	if c, ok := pr.byName[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("pod %s has no container %q", pr.key, name)
}

var errNotRunning = errors.New("container is not running")
