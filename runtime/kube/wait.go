package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"sandboxd/runtime"
)

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

// waitRunning waits on the pod watch until the pod of that uid runs with its container ready,
// and the PVC is in the cache too (so List sees the box). It fails early, saying why, when the
// pod cannot run: unschedulable for longer than UnschedulableTimeout, an image that cannot be
// pulled or started, a container or init container that ended.
func (d *Driver) waitRunning(ctx context.Context, id, name string, uid types.UID) error {
	err := d.waitPod(ctx, name, uid, podWait{what: "the pod", unschedulableFor: d.opts.UnschedulableTimeout,
		ready: func(pod *corev1.Pod) string {
			if !podReady(pod) {
				return "the pod is " + strings.ToLower(string(pod.Status.Phase)) + waitingReason(pod)
			}
			if _, err := d.pvcs.Get(name); err != nil {
				return "the PVC is not in the watch yet"
			}
			return ""
		}})
	if nr, ok := errors.AsType[*podNotRunning](err); ok {
		if nr.deleted {
			return fmt.Errorf("kube: box %s: %s", id, nr.reason)
		}
		return &runtime.StartError{Reason: nr.reason}
	}
	return err
}

// podWait is what waitPod waits for.
type podWait struct {
	// what names the pod in the reasons ("the pod", "the reader pod").
	what string
	// ready says what the pod still lacks ("" once it is ready).
	ready func(pod *corev1.Pod) string
	// unschedulableFor is how long the pod may stay unschedulable (0: until ReadyTimeout).
	unschedulableFor time.Duration
}

// podNotRunning is why a pod waitPod waited for will not run: it cannot (podCannotRun), it
// stayed unschedulable, it did not become ready within ReadyTimeout, or (deleted) it was
// deleted meanwhile.
type podNotRunning struct {
	reason  string
	deleted bool
}

func (e *podNotRunning) Error() string { return e.reason }

// waitPod waits on the pod watch until pod name of uid is ready by w.ready; an older pod of
// the same name is waited out. An unschedulable pod brings no watch event to time it out
// with, so the pod is also checked every second. Errors other than *podNotRunning are the
// informer's.
func (d *Driver) waitPod(ctx context.Context, name string, uid types.UID, w podWait) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	last := w.what + " is not in the watch yet"
	var unschedSince time.Time
	err := d.waitFor(ctx, time.Second, func() (bool, error) {
		pod, err := d.pods.Get(name)
		if apierrors.IsNotFound(err) {
			last = w.what + " is not in the watch yet"
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
			return false, &podNotRunning{reason: w.what + " was deleted while starting", deleted: true}
		}
		if why := podCannotRun(pod); why != "" {
			return false, &podNotRunning{reason: why}
		}
		if msg, ok := unschedulable(pod); ok {
			if unschedSince.IsZero() {
				unschedSince = time.Now()
			}
			last = w.what + " cannot be scheduled: " + msg
			if w.unschedulableFor > 0 && time.Since(unschedSince) > w.unschedulableFor {
				return false, &podNotRunning{reason: last}
			}
			return false, nil
		}
		unschedSince = time.Time{}
		if why := w.ready(pod); why != "" {
			last = why
			return false, nil
		}
		return true, nil
	})
	if err != nil && ctx.Err() != nil && !errors.As(err, new(*podNotRunning)) {
		return &podNotRunning{reason: fmt.Sprintf("%s did not run within %v: %s", w.what, d.opts.ReadyTimeout, last)}
	}
	return err
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
