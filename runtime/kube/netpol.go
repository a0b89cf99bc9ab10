package kube

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// A box's network policy on Kubernetes is one NetworkPolicy in the box's namespace, named like
// its pod and PVC, selecting its pod by the sandbox-id label, owned by its PVC (so it goes with
// the box, even when the driver's own delete never runs). It has policyTypes Ingress and
// Egress and no ingress rule: nothing reaches a sandbox's pod over the network (the control
// plane attaches through the API server's pods/exec). Its egress is generated from the box's
// effective policy (internal/netpolicy) and nothing else:
//
//   - mode none, a nil policy (records from before network policies) or anything that is not
//     plainly "egress": no egress rule, so the pod sends nothing;
//   - egress: one rule to the ipBlocks of netpolicy.IPBlocks (every allowed CIDR with the denied
//     ranges inside it as exceptions: the union decides every address as the local runtime's
//     nftables rules do), all ports; and one rule to the resolvers on UDP and TCP 53: the
//     policy's DNS addresses as /32 ipBlocks, and the configured DNS peer, the cluster DNS's
//     pods (unless the peer is disabled). The peer is needed because the resolver a
//     gateway in a cluster finds in its resolv.conf (the domain's default) is the cluster
//     DNS's Service address, and most CNIs apply policies after that address was translated
//     to a pod's: an ipBlock of the Service address alone would match nothing.
//
// NetworkPolicy is allow-only: it cannot say "all ports but 53", so an allowed CIDR allows its
// port 53 too. The namespace's default deny (deploy/base) closes everything these policies do
// not open, so a pod whose policy is missing has no network at all: it fails closed.

// DNSPeer names the cluster DNS's pods, by their namespace and labels: an egress box's DNS
// queries may go to them besides the policy's resolver addresses (which, on a cluster, are
// usually their Service's address).
type DNSPeer struct {
	// Namespace is the DNS pods' namespace (default kube-system).
	Namespace string `json:"namespace"`
	// PodLabels select the DNS pods (default k8s-app: kube-dns).
	PodLabels map[string]string `json:"pod_labels"`
	// Disabled leaves the peer out: DNS goes to the policy's resolver addresses only (for
	// resolvers outside the cluster, which then never answer cluster names).
	Disabled bool `json:"disabled"`
}

// The cluster DNS of kubeadm, GKE, EKS and kind.
const (
	defaultDNSNamespace = "kube-system"
	// maxDNSPeerLabels bounds dns_peer.pod_labels (a selector, not a catalog).
	maxDNSPeerLabels = 8
	// podNameservers is Kubernetes' bound on a pod's dnsConfig nameservers.
	podNameservers = 3
)

func defaultDNSPodLabels() map[string]string { return map[string]string{"k8s-app": "kube-dns"} }

// withDefaults fills the empty fields of p.
func (p DNSPeer) withDefaults() DNSPeer {
	if p.Namespace == "" {
		p.Namespace = defaultDNSNamespace
	}
	if len(p.PodLabels) == 0 {
		p.PodLabels = defaultDNSPodLabels()
	}
	return p
}

// Validate checks a configured peer: a namespace name and a few valid labels.
func (p DNSPeer) Validate() error {
	if p.Disabled && (p.Namespace != "" || len(p.PodLabels) > 0) {
		return fmt.Errorf("kube.dns_peer: disabled, and yet a namespace or pod_labels: say one")
	}
	if p.Namespace != "" {
		if errs := validation.IsDNS1123Label(p.Namespace); len(errs) > 0 {
			return fmt.Errorf("kube.dns_peer.namespace %q: %v", p.Namespace, errs)
		}
	}
	if len(p.PodLabels) > maxDNSPeerLabels {
		return fmt.Errorf("kube.dns_peer.pod_labels: at most %d labels", maxDNSPeerLabels)
	}
	for k, v := range p.PodLabels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("kube.dns_peer.pod_labels: key %q: %v", k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("kube.dns_peer.pod_labels: %s=%q: %v", k, v, errs)
		}
	}
	return nil
}

// egressPolicy is a box's policy when it is plainly egress; nil (deny everything) otherwise.
func egressPolicy(spec runtime.BoxSpec) *runtime.NetworkPolicy {
	p := spec.NetworkPolicy
	if spec.Network != netpolicy.ModeEgress || p == nil || p.Mode != netpolicy.ModeEgress {
		return nil
	}
	return p
}

// netpolLabels are a box's NetworkPolicy's labels: the driver's own, never the caller's (which
// the policy does not mirror).
func netpolLabels(rec runtime.Record) map[string]string {
	return map[string]string{
		LabelManagedBy: managedBy,
		LabelSandboxID: rec.ID,
		LabelTenant:    labelValue(rec.Tenant),
		LabelProject:   labelValue(rec.Project),
		LabelProfile:   labelValue(rec.Spec.Profile),
	}
}

// newNetworkPolicy is box rec's NetworkPolicy, owned by its PVC.
func (s podSettings) newNetworkPolicy(name string, rec runtime.Record, pvc *corev1.PersistentVolumeClaim) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: s.namespace, Labels: netpolLabels(rec),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: pvc.Name, UID: pvc.UID,
			}},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				LabelManagedBy: managedBy,
				LabelSandboxID: rec.ID,
			}},
			// Both types and no ingress rule: nothing comes in.
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Egress:      s.egressRules(egressPolicy(rec.Spec)),
		},
	}
	return np
}

// egressRules renders an egress policy (nil: none at all). A rule is never emitted with an
// empty "to" (which NetworkPolicy reads as every destination) or empty ports.
func (s podSettings) egressRules(p *runtime.NetworkPolicy) []networkingv1.NetworkPolicyEgressRule {
	if p == nil {
		return nil
	}
	var rules []networkingv1.NetworkPolicyEgressRule
	var to []networkingv1.NetworkPolicyPeer
	for _, b := range netpolicy.IPBlocks(netpolicy.PolicyRules(p)) {
		to = append(to, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: b.CIDR, Except: b.Except}})
	}
	if len(to) > 0 {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: to})
	}
	var dns []networkingv1.NetworkPolicyPeer
	for _, a := range netpolicy.DNSAddrs(p) {
		dns = append(dns, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: a.String() + "/32"}})
	}
	if peer := s.dnsPeer.withDefaults(); !peer.Disabled {
		dns = append(dns, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: peer.Namespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: maps.Clone(peer.PodLabels)},
		})
	}
	if len(dns) == 0 {
		return rules // no resolver: no DNS
	}
	udp, tcp, port := corev1.ProtocolUDP, corev1.ProtocolTCP, intstr.FromInt32(53)
	rules = append(rules, networkingv1.NetworkPolicyEgressRule{
		To:    dns,
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &port}, {Protocol: &tcp, Port: &port}},
	})
	return rules
}

// podDNS is the DNS setting of an egress box's pod whose policy names its resolvers: those
// (Kubernetes takes at most three), and no cluster search domains. nil keeps the pod's
// default (the cluster DNS, which the DNS peer allows).
func podDNS(spec runtime.BoxSpec) *corev1.PodDNSConfig {
	addrs := netpolicy.DNSAddrs(egressPolicy(spec))
	if len(addrs) == 0 {
		return nil
	}
	cfg := &corev1.PodDNSConfig{}
	for _, a := range addrs[:min(len(addrs), podNameservers)] {
		cfg.Nameservers = append(cfg.Nameservers, a.String())
	}
	return cfg
}

// ensureNetworkPolicy makes box rec's NetworkPolicy what its record says: created, or updated
// on the resourceVersion it was read with (again on a conflict) when its spec, labels or owner
// differ. It runs before every pod of the box is created, so a pod never runs under a policy
// older than its record; an error fails the create or start before the pod exists. fresh (a
// box just created) tries the create first: there is no policy to read yet.
func (d *Driver) ensureNetworkPolicy(ctx context.Context, name string, rec runtime.Record, pvc *corev1.PersistentVolumeClaim, fresh bool) error {
	want := d.set.newNetworkPolicy(name, rec, pvc)
	api := d.cs.NetworkingV1().NetworkPolicies(d.opts.Namespace)
	if fresh {
		_, err := api.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: create NetworkPolicy %s: %w", name, err)
		}
	}
	for attempt := 0; ; attempt++ {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, want, metav1.CreateOptions{})
			if err == nil {
				return nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("kube: create NetworkPolicy %s: %w", name, err)
			}
		case err != nil:
			return fmt.Errorf("kube: get NetworkPolicy %s: %w", name, err)
		case cur.DeletionTimestamp != nil:
			err = fmt.Errorf("NetworkPolicy %s is being deleted", name)
		case sameNetworkPolicy(cur, want):
			return nil
		default:
			next := cur.DeepCopy()
			next.Labels, next.OwnerReferences, next.Spec = want.Labels, want.OwnerReferences, want.Spec
			_, err = api.Update(ctx, next, metav1.UpdateOptions{})
			if err == nil {
				return nil
			}
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return fmt.Errorf("kube: update NetworkPolicy %s: %w", name, err)
			}
		}
		// Another writer, or a deletion, in between: read again.
		wait := time.Duration(rand.Int64N(int64(min(5*time.Millisecond<<min(attempt, 5), 200*time.Millisecond)) + 1))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("kube: NetworkPolicy %s: %w (last: %v)", name, ctx.Err(), err)
		}
	}
}

// sameNetworkPolicy tells whether cur already is want (the API server fills no defaults in a
// NetworkPolicy's spec that want leaves out: both are compared as written).
func sameNetworkPolicy(cur, want *networkingv1.NetworkPolicy) bool {
	return maps.Equal(cur.Labels, want.Labels) &&
		slices.EqualFunc(cur.OwnerReferences, want.OwnerReferences, func(a, b metav1.OwnerReference) bool {
			return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID
		}) &&
		reflect.DeepEqual(normalizeSpec(cur.Spec), normalizeSpec(want.Spec))
}

// normalizeSpec makes empty and nil lists alike (the API server returns an empty list as
// absent).
func normalizeSpec(s networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicySpec {
	s = *s.DeepCopy()
	if len(s.Ingress) == 0 {
		s.Ingress = nil
	}
	if len(s.Egress) == 0 {
		s.Egress = nil
	}
	for i := range s.Egress {
		for j := range s.Egress[i].To {
			if b := s.Egress[i].To[j].IPBlock; b != nil && len(b.Except) == 0 {
				b.Except = nil
			}
		}
	}
	return s
}

// deleteNetworkPolicy deletes a box's NetworkPolicy (gone already is fine).
func (d *Driver) deleteNetworkPolicy(ctx context.Context, name string) error {
	err := d.cs.NetworkingV1().NetworkPolicies(d.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: delete NetworkPolicy %s: %w", name, err)
	}
	return nil
}
