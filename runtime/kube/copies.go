package kube

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// pvcCopies holds the PVCs this replica last read or wrote through the API server until its
// watch catches up with them. A write of a record starts from the freshest copy at hand (this
// one, or the watch's when that is as new) instead of a GET: the write carries that copy's
// resourceVersion, so the API server refuses it when the copy is stale, and only then is the
// PVC read again. Two writes in a row (a warm claim and its RUNNING) cost two round trips
// instead of four. A copy goes when the watch shows a later version or the PVC's deletion,
// or when a lookup finds the watch's as new: the map holds at most one copy per live PVC
// (a read the watch had already delivered stays until the PVC's next use or change).
type pvcCopies struct {
	mu sync.Mutex
	m  map[string]*corev1.PersistentVolumeClaim
}

// keep remembers pvc (as the API server answered it; not to be changed afterwards).
func (c *pvcCopies) keep(pvc *corev1.PersistentVolumeClaim) {
	if pvc == nil || pvc.ResourceVersion == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[pvc.Name]; old != nil && newer(old, pvc) {
		return
	}
	if c.m == nil {
		c.m = map[string]*corev1.PersistentVolumeClaim{}
	}
	c.m[pvc.Name] = pvc
}

// seen is the watch's news of pvc: a copy it is as new as goes.
func (c *pvcCopies) seen(pvc *corev1.PersistentVolumeClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[pvc.Name]; old != nil && !newer(old, pvc) {
		delete(c.m, pvc.Name)
	}
}

// forget drops the copy of PVC name (deleted, or found stale).
func (c *pvcCopies) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, name)
}

// freshest returns a deep copy of the newer of the copy held here and watched (the watch's
// object, nil when it has none), or nil when neither exists.
func (c *pvcCopies) freshest(name string, watched *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	c.mu.Lock()
	own := c.m[name]
	if own != nil && watched != nil && (own.UID != watched.UID || !newer(own, watched)) {
		delete(c.m, name)
		own = nil
	}
	c.mu.Unlock()
	switch {
	case own != nil:
		return own.DeepCopy()
	case watched != nil:
		return watched.DeepCopy()
	}
	return nil
}

// newer reports whether a's resourceVersion is later than b's. Versions that do not compare
// (an API server whose versions are not integers) count as not newer: the watch's object is
// used, as a GET would have been.
func newer(a, b *corev1.PersistentVolumeClaim) bool {
	n, err := resourceversion.CompareResourceVersion(a.ResourceVersion, b.ResourceVersion)
	return err == nil && n > 0
}
