package kube

import (
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"sandboxd/runtime"
)

// LargestPolicy is largestPolicy, for the tests against the API server.
func LargestPolicy() runtime.NetworkPolicy { return largestPolicy() }

// RenderNetworkPolicy is the NetworkPolicy of box rec in namespace ns, owned by pvc.
func RenderNetworkPolicy(ns string, rec runtime.Record, pvc *corev1.PersistentVolumeClaim) *networkingv1.NetworkPolicy {
	name, _ := ObjectName(rec.ID)
	return podSettings{namespace: ns}.newNetworkPolicy(name, rec, pvc)
}

// CheckDefaultDeny is checkDefaultDeny: the manifests' policies for sandbox-jobs are the
// default deny alone.
func CheckDefaultDeny(t *testing.T, r io.Reader) { checkDefaultDeny(t, r) }

// PlantCopy makes pvc the driver's own copy of its PVC, as if it had last read or written
// it (the tests plant stale copies).
func PlantCopy(d *Driver, pvc *corev1.PersistentVolumeClaim) {
	d.copies.mu.Lock()
	defer d.copies.mu.Unlock()
	if d.copies.m == nil {
		d.copies.m = map[string]*corev1.PersistentVolumeClaim{}
	}
	d.copies.m[pvc.Name] = pvc
}

// UseInitConnect makes d attach with the init's connect instead of the connect program.
func UseInitConnect(d *Driver) { d.initConnect = true }
