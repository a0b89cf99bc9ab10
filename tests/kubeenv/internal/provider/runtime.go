package provider

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/tests/kubeenv/internal/engine"
)

// reasonSandboxCreate is the pod's reason when its runtime cannot be found: the kubelet's
// event reason when the container runtime refuses the pod's sandbox (for a runtime handler
// it has no runtime for, or a RuntimeClass it cannot read).
const reasonSandboxCreate = "FailedCreatePodSandBox"

// engineFor returns the runtime of a pod, as a kubelet picks it: the handler of the pod's
// RuntimeClass (read from the API), runsc for a pod without one. It returns a message
// for the pod's failure when the class cannot be read or names a handler this node has no
// runtime for.
func (p *Provider) engineFor(ctx context.Context, class *string) (engine.Engine, string) {
	name := ""
	if class != nil {
		name = *class
	}
	if name == "" {
		return p.engines[engine.Runsc], ""
	}
	rc, err := p.cfg.Client.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("Failed to create pod sandbox: RuntimeClass %q not found", name)
		}
		return nil, fmt.Sprintf("Failed to create pod sandbox: failed to look up RuntimeClass %q: %v", name, err)
	}
	if e, ok := p.engines[rc.Handler]; ok {
		return e, ""
	}
	msg := fmt.Sprintf("Failed to create pod sandbox: no runtime for handler %q (RuntimeClass %q) is configured on this node (handlers: %s)",
		rc.Handler, name, strings.Join(slices.Sorted(maps.Keys(p.engines)), ", "))
	if rc.Handler == engine.Runc {
		msg += "; start the node with --runc (Debian package runc)"
	}
	return nil, msg
}
