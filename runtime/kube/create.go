package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/runtime"
)

// Create implements runtime.Driver: the PVC (with the record), the NetworkPolicy (owned by the
// PVC), then the pod; it returns once the guest init answers an attach. On failure it deletes
// what it made.
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
	created, err := d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: box %s: %w", rec.ID, runtime.ErrExists)
		}
		return fmt.Errorf("kube: create PVC %s: %w", name, err)
	}
	d.copies.keep(created.DeepCopy())
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if derr := d.Delete(cctx, rec.ID); derr != nil {
				d.log.Error("cleanup after a failed create", "box", rec.ID, "err", derr)
			}
		}
	}()
	// The policy before the pod: the pod never runs under another.
	if err := d.ensureNetworkPolicy(ctx, name, rec, created, true); err != nil {
		return err
	}
	if err := d.runPod(ctx, rec.ID, name, pod); err != nil {
		return err
	}
	d.log.Debug("box created", "box", rec.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// runPod creates the pod, waits for it to run and for the guest init to answer, and keeps that
// first attach as the box's spare. An old pod of the same name must be gone.
func (d *Driver) runPod(ctx context.Context, id, name string, pod *corev1.Pod) error {
	start := time.Now()
	created, err := d.cs.CoreV1().Pods(d.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kube: create pod %s: %w", name, err)
	}
	if err := d.waitRunning(ctx, id, name, created.UID); err != nil {
		return err
	}
	running := time.Now()
	key, err := podChannelKey(pod)
	if err != nil {
		return err
	}
	// A pod whose PID 1 waits for its key gets it on this, its first attach, and never again:
	// the mark goes on the pod before any call can run a command in it.
	provision := !provisioned(pod)
	rwc, err := d.attach(ctx, id, name, key, provision)
	if err != nil {
		return fmt.Errorf("kube: box %s: the guest init does not answer: %w", id, err)
	}
	attached := time.Now()
	if provision {
		if err := d.patchPodMeta(ctx, name, "annotations", map[string]any{AnnChannelReady: "true"}); err != nil {
			rwc.Close()
			return fmt.Errorf("kube: box %s: marking its pod's channel ready: %w", id, err)
		}
	}
	d.spares.Keep(id, rwc)
	// Where a create's or start's wait went, for a slow one: the pod's run (scheduling, the
	// node, the watch), the first attach, the mark.
	d.log.Debug("box pod running", "box", id, "running_ms", running.Sub(start).Milliseconds(),
		"attach_ms", attached.Sub(running).Milliseconds(), "mark_ms", time.Since(attached).Milliseconds())
	return nil
}
