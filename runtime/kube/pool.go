package kube

import (
	"context"
	"errors"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"sandboxd/runtime"
)

// Warm pools (runtime.Pooler). A box of a pool is an ordinary box (PVC, NetworkPolicy, pod)
// whose record names the pool (AnnPool) and whose PVC and pod carry LabelPool. Get, List and
// UpdateRecord leave it out; ListPool lists it. UpdatePool writes its record like UpdateRecord,
// on the PVC's resourceVersion: of two replicas claiming one box, the second write conflicts,
// reads the PVC again and finds the box claimed (ErrNotFound), so no box is claimed twice in
// the cluster. The claim relabels the PVC in the same write (tenant, project, the caller's
// labels, LabelPool gone) and then the pod with a merge patch, which runs beside the claimer's
// next steps until the box's next UpdateRecord (Driver.relabels). The pools are the cluster's,
// shared by every replica (runtime.SharedPooler).

var _ runtime.SharedPooler = (*Driver)(nil)

// PoolsShared implements runtime.SharedPooler: every replica sees the cluster's pool boxes.
func (d *Driver) PoolsShared() {}

// ListPool implements runtime.Pooler: the boxes of every pool, from the watches' caches.
func (d *Driver) ListPool(ctx context.Context) ([]runtime.Box, error) { return d.listBoxes(true) }

// UpdatePool implements runtime.Pooler.
func (d *Driver) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	name, err := ObjectName(id)
	if err != nil {
		return runtime.Record{}, err
	}
	var rec runtime.Record
	_, err = d.updatePVC(ctx, id, name, func(pvc *corev1.PersistentVolumeClaim) error {
		ann, lbl := maps.Clone(pvc.Annotations), maps.Clone(pvc.Labels)
		r, _, err := applyRecord(ctx, id, pvc, true, fn)
		if err != nil {
			return err
		}
		rec = r
		maps.Copy(pvc.Labels, ownLabels(r))
		if r.Pool == "" {
			delete(pvc.Labels, LabelPool)
		}
		if err := encodeRecord(pvc.Annotations, r); err != nil {
			return err
		}
		if maps.Equal(ann, pvc.Annotations) && maps.Equal(lbl, pvc.Labels) {
			return errUnchanged // a look (a claim's check that the box is still ready) writes nothing
		}
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return rec, nil
	}
	if err != nil {
		return runtime.Record{}, err
	}
	if rec.Pool == "" {
		d.relabels.Start(name, func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relabelTimeout)
			defer cancel()
			d.relabelClaimed(rctx, id, name, rec)
		})
	}
	return rec, nil
}

// relabelTimeout bounds a claimed box's pod relabel.
const relabelTimeout = 30 * time.Second

// ownLabels are the driver's labels of a record (boxLabels without the caller's).
func ownLabels(rec runtime.Record) map[string]string {
	l := boxLabels(rec)
	for k := range l {
		if !ownLabel(k) {
			delete(l, k)
		}
	}
	return l
}

// relabelClaimed gives a claimed box's pod the labels of its sandbox (its owner's, the
// caller's, no LabelPool) with a merge patch. The record is the truth and a new pod is made
// from it: a pod that cannot be patched keeps the pool's labels until the sandbox starts again.
func (d *Driver) relabelClaimed(ctx context.Context, id, name string, rec runtime.Record) {
	set := map[string]any{LabelPool: nil}
	for k, v := range boxLabels(rec) {
		set[k] = v
	}
	if err := d.patchPodMeta(ctx, name, "labels", set); err != nil && !apierrors.IsNotFound(err) {
		d.log.Warn("could not relabel a claimed pool box's pod; it gets its labels when it starts again", "sandbox", id, "err", err)
	}
}
