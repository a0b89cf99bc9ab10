package kube

import (
	"errors"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"
)

// Config is the kube section of sandboxd's config. Its zero value is the default: every empty
// or zero field takes the driver's default (Options).
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster (the pod's service account).
	Kubeconfig string `json:"kubeconfig"`
	// Namespace holds the sandboxes' pods and PVCs (default sandbox-jobs).
	Namespace string `json:"namespace"`
	// InitImage is the image holding the static guest init at /sandbox-init (its init
	// container copies it into each pod whose image does not carry the init). Required when a
	// profile's image lacks the init (image_has_init false).
	InitImage string `json:"init_image"`
	// StorageClass is the workspace PVCs' storage class; empty takes the cluster's default.
	StorageClass string `json:"storage_class"`
	// RuntimeClass is the pods' runtimeClassName (default gvisor).
	RuntimeClass string `json:"runtime_class"`
	// ReadyTimeoutSec bounds a create's or start's wait for its pod (default 120).
	ReadyTimeoutSec int `json:"ready_timeout_sec"`
	// UnschedulableTimeoutSec is how long a pod may stay unschedulable before a create or
	// start fails with the scheduler's reason (default 30).
	UnschedulableTimeoutSec int `json:"unschedulable_timeout_sec"`
	// DNSPeer names the cluster DNS's pods (namespace, pod_labels; default kube-system,
	// k8s-app: kube-dns), where an egress sandbox's DNS may go besides network.dns_servers'
	// addresses; disabled: true leaves them out.
	DNSPeer DNSPeer `json:"dns_peer"`
	// WorkspaceReader reads a stopped sandbox's PVC beside it for the stop's checkpoint (a
	// short-lived pod on the cluster's native runtime), instead of through the sandbox's guest
	// before its pod goes. Off by default.
	WorkspaceReader WorkspaceReader `json:"workspace_reader"`
}

// Validate reports the problems of c's own values. (Whether the kube runtime needs InitImage
// is the caller's check: it knows the profiles, and where else the image may come from.)
func (c Config) Validate() error {
	if c.ReadyTimeoutSec < 0 || c.UnschedulableTimeoutSec < 0 {
		return errors.New("kube: ready_timeout_sec and unschedulable_timeout_sec must not be negative")
	}
	if w := c.WorkspaceReader; w.Enabled && c.InitImage == "" {
		return errors.New("kube: workspace_reader needs init_image (the reader pod runs its init)")
	}
	if w := c.WorkspaceReader; w.MilliCPU < 0 || w.MemoryBytes < 0 {
		return errors.New("kube: workspace_reader's milli_cpu and memory_bytes must not be negative")
	}
	return c.DNSPeer.Validate()
}

// Options are the driver's options from c, reaching the API server through rc.
func (c Config) Options(rc *rest.Config, log *slog.Logger) Options {
	return Options{
		Config:               rc,
		Namespace:            c.Namespace,
		InitImage:            c.InitImage,
		RuntimeClass:         c.RuntimeClass,
		StorageClass:         c.StorageClass,
		ReadyTimeout:         time.Duration(c.ReadyTimeoutSec) * time.Second,
		UnschedulableTimeout: time.Duration(c.UnschedulableTimeoutSec) * time.Second,
		DNSPeer:              c.DNSPeer,
		WorkspaceReader:      c.WorkspaceReader,
		Logger:               log,
	}
}
