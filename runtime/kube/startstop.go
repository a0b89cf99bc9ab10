package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Start implements runtime.Driver: the box's NetworkPolicy made what its record says, then a
// new pod on the kept PVC. fresh is always false: the workspace is the PVC, which lives as
// long as the box.
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
	// The policy before any pod, and also under a pod that runs already (made before this
	// sandboxd wrote policies, or its policy deleted behind our back).
	if err := d.ensureNetworkPolicy(ctx, name, rec, pvc, false); err != nil {
		return false, err
	}
	if pod, err := d.pods.Get(name); err == nil {
		pod = d.freshUnlessProvisioned(ctx, name, pod)
		_, keyErr := podChannelKey(pod)
		if pod.DeletionTimestamp == nil && podReady(pod) && pvc.Annotations[AnnCompute] == computeRunning && keyErr == nil && provisioned(pod) {
			return false, nil
		}
		// A failed, pending or terminating pod of an earlier life, or one whose first attach
		// never brought its key (a start cut short): replace it.
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
	return d.stopBox(ctx, id, name)
}

// stopBox is Stop once the box's PVC was read and the caller's fence admitted.
func (d *Driver) stopBox(ctx context.Context, id, name string) error {
	d.spares.Drop(id)
	if err := d.setCompute(ctx, id, name, computeStopped); err != nil {
		return err
	}
	return d.deletePod(ctx, name, terminationGraceSc)
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
