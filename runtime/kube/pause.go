package kube

import (
	"context"
	"fmt"
	"io"

	"sandboxd/runtime"
)

// errNoPause is every pause and resume on this driver. Kubernetes has no way to save a gVisor
// pod's memory that this driver could use and test: the kubelet's checkpoint API
// (ContainerCheckpoint) needs a container runtime that implements it, writes a local archive
// on the node that no pod can be created from, and there is no "restore into a pod". A
// sandbox on this runtime keeps its workspace across a stop; its processes end.
func errNoPause(id string) error {
	return fmt.Errorf("kube: sandbox %s: the Kubernetes runtime cannot keep a sandbox's memory (pause and resume need the local runtime); stop it instead: %w",
		id, runtime.ErrUnsupported)
}

// Pause implements runtime.Driver: not supported (errNoPause).
func (d *Driver) Pause(_ context.Context, id string) error { return errNoPause(id) }

// MemoryImage implements runtime.Driver: this driver never keeps one.
func (d *Driver) MemoryImage(_ context.Context, id string) (io.ReadCloser, error) {
	return nil, fmt.Errorf("kube: sandbox %s has no memory image: %w", id, runtime.ErrNotFound)
}

// DropMemoryImage implements runtime.Driver: there is none to drop.
func (d *Driver) DropMemoryImage(context.Context, string) error { return nil }

// Resume implements runtime.Driver: not supported (errNoPause).
func (d *Driver) Resume(_ context.Context, id string, _ runtime.ImageSource) error {
	return errNoPause(id)
}
