package kube

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/runtime"
)

// Delete implements runtime.Driver: the pod (at once), its NetworkPolicy and the PVC. It
// returns once the watch shows the PVC gone or terminating (Get and List then no longer see
// the box).
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
	// The box's pod, and a workspace reader left on its PVC (which would hold the PVC's
	// deletion until the reader's deadline).
	for _, pod := range []string{name, name + readerSuffix} {
		err = d.cs.CoreV1().Pods(d.opts.Namespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube: delete pod %s: %w", pod, err)
		}
	}
	// The PVC owns the policy (the garbage collector would delete it too); deleted here so
	// that nothing of the box is left once Delete returns.
	if err := d.deleteNetworkPolicy(ctx, name); err != nil {
		return err
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
