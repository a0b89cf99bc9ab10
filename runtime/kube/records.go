package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"sandboxd/runtime"
)

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

// localPVC is the freshest copy of box id's PVC held by this replica (its own last read or
// write, or the watch's), nil when there is none or it is not the box's live PVC.
func (d *Driver) localPVC(id, name string) *corev1.PersistentVolumeClaim {
	watched, _ := d.pvcs.Get(name)
	pvc := d.copies.freshest(name, watched)
	if pvc == nil || pvc.DeletionTimestamp != nil || pvc.Labels[LabelSandboxID] != id {
		return nil
	}
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	return pvc
}

// updatePVC applies fn to the box's PVC and writes it, again with a fresh read on a conflict
// (another replica, or another goroutine, wrote in between) until ctx ends.
func (d *Driver) updatePVC(ctx context.Context, id, name string, fn func(*corev1.PersistentVolumeClaim) error) (*corev1.PersistentVolumeClaim, error) {
	// The first attempt starts from the freshest copy at hand (copies.go). What fn decides on
	// a copy that turns out stale is never written (the write's resourceVersion conflicts),
	// and an answer other than a write (a refusal, nothing to change) is asked again on a
	// fresh read, as it would be wrong on a stale copy.
	pvc := d.localPVC(id, name)
	for attempt := 0; ; attempt++ {
		local := pvc != nil
		if !local {
			var err error
			if pvc, err = d.getPVC(ctx, id, name); err != nil {
				return nil, err
			}
			d.copies.keep(pvc.DeepCopy())
		}
		if err := fn(pvc); err != nil {
			if local {
				pvc = nil
				continue
			}
			return nil, err
		}
		out, err := d.cs.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Update(ctx, pvc, metav1.UpdateOptions{})
		pvc = nil
		if err == nil {
			d.copies.keep(out.DeepCopy())
			return out, nil
		}
		if local && (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) {
			// A stale copy (of a PVC since deleted, too): read it now, no wait (nobody
			// collided with a read); a deleted PVC is then ErrNotFound, as a read says.
			d.copies.forget(name)
			continue
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
	var prevLabels map[string]string
	_, err = d.updatePVC(ctx, id, name, func(pvc *corev1.PersistentVolumeClaim) error {
		r, prev, err := applyRecord(ctx, id, pvc, false, fn)
		if err != nil {
			return err
		}
		rec, prevLabels = r, prev
		return encodeRecord(pvc.Annotations, r)
	})
	_ = d.relabels.Wait(ctx, name) // ctx ended: the write stands, and its caller sees ctx end
	if err != nil {
		return runtime.Record{}, err
	}
	if !maps.Equal(prevLabels, rec.Labels) {
		d.labelPod(ctx, id, name, prevLabels, rec.Labels)
	}
	return rec, nil
}

// applyRecord is the core of UpdateRecord and UpdatePool, on a fresh read of the box's PVC: it
// decodes the record, which must be of a warm pool's box (pooled) or of any other (ErrNotFound
// otherwise), admits ctx's fence (raising the PVC's), applies fn, and mirrors the record's
// labels onto the PVC's. It returns the new record and its labels before fn; the caller encodes
// the record into the PVC's annotations.
func applyRecord(ctx context.Context, id string, pvc *corev1.PersistentVolumeClaim, pooled bool, fn func(*runtime.Record) error) (runtime.Record, map[string]string, error) {
	r, err := decodeRecord(pvc.Labels, pvc.Annotations)
	if err != nil {
		return r, nil, fmt.Errorf("kube: box %s: %w", id, err)
	}
	switch {
	case pooled && r.Pool == "":
		return r, nil, fmt.Errorf("kube: box %s is no warm pool's (claimed already): %w", id, runtime.ErrNotFound)
	case !pooled && r.Pool != "":
		return r, nil, fmt.Errorf("kube: box %s is a warm pool's: %w", id, runtime.ErrNotFound)
	}
	if _, err := admitFence(ctx, pvc); err != nil {
		return r, nil, fmt.Errorf("kube: box %s: %w", id, err)
	}
	prev := maps.Clone(r.Labels)
	if err := fn(&r); err != nil {
		return r, nil, err
	}
	if r.ID != id {
		return r, nil, fmt.Errorf("kube: box %s: an update may not change the id", id)
	}
	if pvc.Labels == nil {
		pvc.Labels = map[string]string{}
	}
	mirrorLabels(pvc.Labels, prev, r.Labels)
	return r, prev, nil
}

// labelPod mirrors a record's changed labels onto the box's pod, if it has one, with a merge
// patch (a removed label is null). The record is the truth and a new pod is made from it, so
// a pod that cannot be patched keeps its old labels until the box starts again: logged, not
// an error of the update.
func (d *Driver) labelPod(ctx context.Context, id, name string, prev, next map[string]string) {
	set := map[string]any{}
	for k := range prev {
		if _, keep := next[k]; !keep && !ownLabel(k) {
			set[k] = nil
		}
	}
	for k, v := range next {
		if !ownLabel(k) {
			set[k] = v
		}
	}
	if len(set) == 0 {
		return
	}
	if err := d.patchPodMeta(ctx, name, "labels", set); err != nil && !apierrors.IsNotFound(err) {
		d.log.Warn("could not label the sandbox's pod; it gets the labels when it starts again", "sandbox", id, "err", err)
	}
}

// patchPodMeta merges set into the pod's metadata field (labels or annotations; a nil value
// removes a key) with a merge patch.
func (d *Driver) patchPodMeta(ctx context.Context, name, field string, set map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{field: set}})
	if err != nil {
		return err
	}
	_, err = d.cs.CoreV1().Pods(d.opts.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
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
	if pvc.Annotations[AnnPool] != "" {
		return runtime.Box{}, fmt.Errorf("kube: box %s is a warm pool's: %w", id, runtime.ErrNotFound)
	}
	return d.box(pvc)
}

// List implements runtime.Driver: every box of the namespace but the warm pools', from the
// watches' caches.
func (d *Driver) List(ctx context.Context) ([]runtime.Box, error) { return d.listBoxes(false) }

// listBoxes lists the boxes of the warm pools (pooled) or every other box, in name order, from
// the watches' caches.
func (d *Driver) listBoxes(pooled bool) ([]runtime.Box, error) {
	pvcs, err := d.pvcs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(pvcs, func(a, b *corev1.PersistentVolumeClaim) int { return strings.Compare(a.Name, b.Name) })
	boxes := make([]runtime.Box, 0, len(pvcs))
	for _, pvc := range pvcs {
		if pvc.DeletionTimestamp != nil || pvc.Labels[LabelSandboxID] == "" || (pvc.Annotations[AnnPool] != "") != pooled {
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
