package kube_test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// The test cluster's node does not enforce NetworkPolicy (it is a virtual kubelet running
// runsc containers with no CNI plugin): these tests check the objects the driver makes, their
// validation by the real API server and their lifecycle, not packets. Enforcement is the
// cluster's CNI's (deploy/README.md says which ones enforce).

// egressSpec is a box whose profile allows a test range, a host inside an always-denied
// range, a pinned name, and denies a part of the range.
var egressSpec = runtime.BoxSpec{Profile: "egress", Image: kubetest.BaseImage, MilliCPU: 1000, MemoryBytes: 512 << 20, DiskBytes: 1 << 30,
	Network: "egress", NetworkPolicy: &runtime.NetworkPolicy{
		Mode:       "egress",
		Allow:      []string{"198.18.0.0/15", "10.1.2.3/32", "mirror.example.com"},
		Deny:       []string{"198.18.5.0/24"},
		AlwaysDeny: netpolicy.DefaultAlwaysDeny,
		Pinned:     map[string][]string{"mirror.example.com": {"203.0.113.9", "169.254.169.254"}},
	}}

// wantEgress is egressSpec's NetworkPolicy spec, as an operator reads it with kubectl.
const wantEgress = `
podSelector:
  matchLabels:
    app.kubernetes.io/managed-by: sandboxd
    sandboxd.io/sandbox-id: SANDBOX_ID
policyTypes: [Ingress, Egress]
egress:
  - to:
      - ipBlock: {cidr: 10.1.2.3/32}
      - ipBlock: {cidr: 203.0.113.9/32}
      - ipBlock: {cidr: 198.18.0.0/15, except: [198.18.5.0/24]}
  - to:
      - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
        podSelector: {matchLabels: {k8s-app: kube-dns}}
    ports:
      - {protocol: UDP, port: 53}
      - {protocol: TCP, port: 53}
`

func getPolicy(t *testing.T, cs kubernetes.Interface, id string) (*networkingv1.NetworkPolicy, error) {
	t.Helper()
	name, _ := kube.ObjectName(id)
	return cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
}

func mustPolicy(t *testing.T, cs kubernetes.Interface, id string) *networkingv1.NetworkPolicy {
	t.Helper()
	np, err := getPolicy(t, cs, id)
	if err != nil {
		t.Fatalf("the NetworkPolicy of %s: %v", id, err)
	}
	return np
}

func specYAML(t *testing.T, s networkingv1.NetworkPolicySpec) string {
	t.Helper()
	b, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestNetworkPolicyObjects: a box's NetworkPolicy exists before its pod, as the API server
// stored it it is the expected spec and selects the box's pod and no other, is owned by the
// box's PVC, is brought back to the record at start (and not rewritten when it already is),
// and is deleted with the box; a PVC deleted behind the driver's back takes its policy along.
func TestNetworkPolicyObjects(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	cs := c.Clientset(t)
	d := newDriver(t, cfg)

	rec := runtimetest.NewRecord(egressSpec)
	name, _ := kube.ObjectName(rec.ID)
	sel := metav1.ListOptions{LabelSelector: kube.LabelSandboxID + "=" + rec.ID}
	podW, err := cs.CoreV1().Pods(kubetest.Namespace).Watch(ctx(t), sel)
	if err != nil {
		t.Fatal(err)
	}
	defer podW.Stop()
	npW, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Watch(ctx(t), sel)
	if err != nil {
		t.Fatal(err)
	}
	defer npW.Stop()
	if err := d.Create(ctx(t), rec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = d.Delete(ctx(t), rec.ID) })

	// The policy was written before the pod: etcd's revision orders the two creations.
	added := func(w watch.Interface) int64 {
		t.Helper()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added {
				rv, err := strconv.ParseInt(ev.Object.(metav1.Object).GetResourceVersion(), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return rv
			}
		}
		t.Fatal("the watch ended without an ADDED event")
		return 0
	}
	if npRV, podRV := added(npW), added(podW); npRV >= podRV {
		t.Errorf("the NetworkPolicy was created at revision %d, the pod at %d: want the policy first", npRV, podRV)
	}

	np := mustPolicy(t, cs, rec.ID)
	var want networkingv1.NetworkPolicySpec
	if err := yaml.UnmarshalStrict([]byte(strings.ReplaceAll(wantEgress, "SANDBOX_ID", rec.ID)), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(np.Spec, want) {
		t.Errorf("the stored spec:\n%s\nwant:\n%s", specYAML(t, np.Spec), specYAML(t, want))
	}
	pvc, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(np.OwnerReferences) != 1 || np.OwnerReferences[0].UID != pvc.UID || np.OwnerReferences[0].Kind != "PersistentVolumeClaim" {
		t.Errorf("ownerReferences %+v, want the PVC %s (uid %s)", np.OwnerReferences, pvc.Name, pvc.UID)
	}
	if np.Labels[kube.LabelSandboxID] != rec.ID || np.Labels[kube.LabelTenant] != "tenant-a" || np.Labels["suite"] != "" {
		t.Errorf("labels %v, want the driver's own (sandbox id, tenant, …), not the caller's", np.Labels)
	}
	t.Logf("the NetworkPolicy of an egress box, as stored:\n%s", storedYAML(t, np))

	// The policy selects its box's pod, and not another box's; that box's policy (none)
	// allows no egress.
	other := runtimetest.CreateBox(t, d, spec)
	selector, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{rec.ID: true, other: false} {
		n, _ := kube.ObjectName(id)
		pod, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := selector.Matches(labels.Set(pod.Labels)); got != want {
			t.Errorf("the policy selects pod %s: %v, want %v", n, got, want)
		}
	}
	if onp := mustPolicy(t, cs, other); len(onp.Spec.Egress) != 0 || len(onp.Spec.Ingress) != 0 || len(onp.Spec.PolicyTypes) != 2 {
		t.Errorf("a none box's policy:\n%s\nwant both policy types and no rule", specYAML(t, onp.Spec))
	}

	// A policy naming its resolvers: the pod asks them (dnsPolicy None), which the API server
	// accepts and the node runs, and the DNS rule is their /32 blocks and the DNS peer.
	dnsSpec := egressSpec
	dnsSpec.NetworkPolicy = &runtime.NetworkPolicy{Mode: "egress", Allow: []string{"198.51.100.0/24"},
		AlwaysDeny: netpolicy.DefaultAlwaysDeny, DNS: []string{"192.0.2.53"}}
	withDNS := runtimetest.CreateBox(t, d, dnsSpec)
	dn, _ := kube.ObjectName(withDNS)
	dpod, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), dn, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dpod.Spec.DNSPolicy != corev1.DNSNone || dpod.Spec.DNSConfig == nil || len(dpod.Spec.DNSConfig.Nameservers) != 1 ||
		dpod.Spec.DNSConfig.Nameservers[0] != "192.0.2.53" {
		t.Errorf("the pod's DNS: %q %+v, want None with 192.0.2.53", dpod.Spec.DNSPolicy, dpod.Spec.DNSConfig)
	}
	if dnp := mustPolicy(t, cs, withDNS); len(dnp.Spec.Egress) != 2 || len(dnp.Spec.Egress[1].To) != 2 ||
		dnp.Spec.Egress[1].To[0].IPBlock == nil || dnp.Spec.Egress[1].To[0].IPBlock.CIDR != "192.0.2.53/32" ||
		dnp.Spec.Egress[1].To[1].PodSelector == nil {
		t.Errorf("the policy naming a resolver:\n%s", specYAML(t, dnp.Spec))
	}

	// A start of a running box with its policy as the record says writes nothing.
	if _, err := d.Start(ctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if again := mustPolicy(t, cs, rec.ID); again.ResourceVersion != np.ResourceVersion {
		t.Errorf("a start with nothing to change rewrote the policy (resourceVersion %s → %s)", np.ResourceVersion, again.ResourceVersion)
	}
	// Deleted behind the driver's back (the namespace's default deny then closes the pod
	// altogether): the next start makes it again, even under the running pod.
	if err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(ctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if again := mustPolicy(t, cs, rec.ID); !reflect.DeepEqual(again.Spec, want) {
		t.Errorf("the policy made again:\n%s", specYAML(t, again.Spec))
	}
	// Stopped, its record narrowed to none: the start rewrites the policy before the new pod.
	if err := d.Stop(ctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := getPolicy(t, cs, rec.ID); err != nil {
		t.Errorf("a stopped box's policy: %v, want it kept", err)
	}
	if _, err := d.UpdateRecord(ctx(t), rec.ID, func(r *runtime.Record) error {
		r.Spec.Network, r.Spec.NetworkPolicy = "none", nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(ctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if np := mustPolicy(t, cs, rec.ID); len(np.Spec.Egress) != 0 {
		t.Errorf("after the record became none:\n%s\nwant no egress rule", specYAML(t, np.Spec))
	}

	// Delete: the policy is gone when Delete returns.
	if err := d.Delete(ctx(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := getPolicy(t, cs, rec.ID); !apierrors.IsNotFound(err) {
		t.Errorf("after Delete the policy: %v, want NotFound", err)
	}

	// The PVC owns the policy: a box whose PVC is deleted by someone else loses its policy
	// to the garbage collector.
	stopped := runtimetest.CreateBox(t, d, egressSpec)
	if err := d.Stop(ctx(t), stopped); err != nil {
		t.Fatal(err)
	}
	sn, _ := kube.ObjectName(stopped)
	if err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Delete(ctx(t), sn, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := getPolicy(t, cs, stopped)
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy of a box whose PVC was deleted: %v after 60 s, want the garbage collector to delete it", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// storedYAML is the policy as `kubectl get -o yaml` shows its meaningful part.
func storedYAML(t *testing.T, np *networkingv1.NetworkPolicy) string {
	t.Helper()
	show := networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: np.Name, Namespace: np.Namespace, Labels: np.Labels,
			OwnerReferences: np.OwnerReferences},
		Spec: np.Spec,
	}
	b, err := yaml.Marshal(show)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestNetworkPolicyValidation: the API server accepts the policies the driver makes, the
// largest the policy model allows included (server-side dry runs, as the control plane's
// identity), and refuses an ipBlock whose exception is not inside its CIDR, so its acceptance
// above means something.
func TestNetworkPolicyValidation(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{UID: "00000000-0000-0000-0000-000000000001"}}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for name, p := range map[string]runtime.NetworkPolicy{
		"largest":      kube.LargestPolicy(),
		"everything":   {Allow: []string{"0.0.0.0/0"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny},
		"dns-blocks":   {Allow: []string{"198.51.100.0/24"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny, DNS: []string{"10.96.0.10", "169.254.20.10"}},
		"nothing":      {AlwaysDeny: netpolicy.DefaultAlwaysDeny},
		"private-host": {Allow: []string{"10.1.2.3/32", "172.16.0.0/12"}, Deny: []string{"172.20.0.0/16"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny},
	} {
		t.Run(name, func(t *testing.T) {
			p.Mode = "egress"
			rec := runtimetest.NewRecord(runtime.BoxSpec{Profile: "p", Network: "egress", NetworkPolicy: &p})
			pvc.Name, _ = kube.ObjectName(rec.ID)
			np := kube.RenderNetworkPolicy(kubetest.Namespace, rec, pvc)
			got, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Create(ctx(t), np, dry)
			if err != nil {
				t.Fatalf("the API server refuses the policy: %v", err)
			}
			if specYAML(t, got.Spec) != specYAML(t, np.Spec) {
				t.Errorf("the API server changed the spec:\n%s\nwant:\n%s", specYAML(t, got.Spec), specYAML(t, np.Spec))
			}
		})
	}
	bad := kube.RenderNetworkPolicy(kubetest.Namespace, runtimetest.NewRecord(runtime.BoxSpec{Profile: "p", Network: "egress",
		NetworkPolicy: &runtime.NetworkPolicy{Mode: "egress", Allow: []string{"198.51.100.0/24"}}}), pvc)
	bad.Spec.Egress[0].To[0].IPBlock.Except = []string{"203.0.113.0/24"}
	if _, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Create(ctx(t), bad, dry); !apierrors.IsInvalid(err) {
		t.Errorf("an except outside its CIDR: %v, want Invalid", err)
	}
}

// TestCreateFailsWithoutPolicy: when the API server refuses a box's policy, the create fails
// with its reason, no pod of the box was ever created, and nothing is left behind. (The
// refusal here is a policy past the API server's size limit: 20 nested allows around 8,192
// denies, far past what the policy model accepts.)
func TestCreateFailsWithoutPolicy(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	cs := c.Clientset(t)
	d := newDriver(t, cfg)
	p := &runtime.NetworkPolicy{Mode: "egress"}
	for bits := 0; bits < 19; bits++ {
		p.Allow = append(p.Allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{8, 0, 0, 0}), bits).Masked().String())
	}
	for i := range 8192 {
		p.Deny = append(p.Deny, netip.AddrFrom4([4]byte{8, 0, byte(i >> 8), byte(i)}).String()+"/32")
	}
	s := spec
	s.Network, s.NetworkPolicy = "egress", p
	rec := runtimetest.NewRecord(s)
	podW, err := cs.CoreV1().Pods(kubetest.Namespace).Watch(ctx(t), metav1.ListOptions{LabelSelector: kube.LabelSandboxID + "=" + rec.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer podW.Stop()
	err = d.Create(ctx(t), rec)
	if err == nil {
		t.Cleanup(func() { _ = d.Delete(ctx(t), rec.ID) })
		t.Fatal("Create with a policy the API server refuses: nil error")
	}
	t.Logf("Create: %v", err)
	if errors.Is(err, runtime.ErrExists) {
		t.Fatalf("Create: %v", err)
	}
	if _, err := d.Get(ctx(t), rec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get after the failed create: %v, want ErrNotFound", err)
	}
	if _, err := getPolicy(t, cs, rec.ID); !apierrors.IsNotFound(err) {
		t.Errorf("the policy after the failed create: %v, want NotFound", err)
	}
	timeout := time.After(2 * time.Second)
	for {
		select {
		case ev := <-podW.ResultChan():
			t.Fatalf("a pod of the box was created (%s %v): a pod ran without its policy", ev.Type, ev.Object.(metav1.Object).GetName())
		case <-timeout:
			return
		}
	}
}

// TestDeployRendersDefaultDeny: deploy/base and every overlay, as kustomize renders them,
// give sandbox-jobs the default deny and nothing else (an overlay cannot quietly reopen it).
func TestDeployRendersDefaultDeny(t *testing.T) {
	c := kubetest.Require(t)
	for _, dir := range []string{"deploy/base", "deploy/overlays/dev", "deploy/overlays/gke"} {
		t.Run(strings.ReplaceAll(dir, "/", "-"), func(t *testing.T) {
			out, err := c.Run(nil, "kustomize", filepath.Join(kubetest.RepoRoot(), dir))
			if err != nil {
				t.Fatal(err)
			}
			kube.CheckDefaultDeny(t, strings.NewReader(out))
		})
	}
}

// TestCheckNeedsNetworkPolicies: an identity whose Role has everything but NetworkPolicies (a
// gateway upgraded before its Role) fails the driver's check, naming them, instead of failing
// every create later.
func TestCheckNeedsNetworkPolicies(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	cs := c.Clientset(t)
	const account = "sandbox-gateway-without-netpol"
	role, err := cs.RbacV1().Roles(kubetest.Namespace).Get(ctx(t), kubetest.GatewayAccount, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	for _, r := range role.Rules {
		if !slices.Contains(r.Resources, "networkpolicies") {
			rules = append(rules, r)
		}
	}
	if len(rules) == len(role.Rules) {
		t.Fatal("deploy/base's Role has no networkpolicies rule")
	}
	objs := []struct {
		create func() error
		del    func() error
	}{
		{func() error {
			_, err := cs.CoreV1().ServiceAccounts(kubetest.GatewayNamespace).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account}}, metav1.CreateOptions{})
			return err
		}, func() error {
			return cs.CoreV1().ServiceAccounts(kubetest.GatewayNamespace).Delete(ctx(t), account, metav1.DeleteOptions{})
		}},
		{func() error {
			_, err := cs.RbacV1().Roles(kubetest.Namespace).Create(ctx(t), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: account}, Rules: rules}, metav1.CreateOptions{})
			return err
		}, func() error {
			return cs.RbacV1().Roles(kubetest.Namespace).Delete(ctx(t), account, metav1.DeleteOptions{})
		}},
		{func() error {
			_, err := cs.RbacV1().RoleBindings(kubetest.Namespace).Create(ctx(t), &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: account},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: account},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: account, Namespace: kubetest.GatewayNamespace}},
			}, metav1.CreateOptions{})
			return err
		}, func() error {
			return cs.RbacV1().RoleBindings(kubetest.Namespace).Delete(ctx(t), account, metav1.DeleteOptions{})
		}},
	}
	for _, o := range objs {
		if err := o.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.del() })
	}
	secs := int64(600)
	tok, err := cs.CoreV1().ServiceAccounts(kubetest.GatewayNamespace).CreateToken(ctx(t), account,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	limited := rest.CopyConfig(cfg)
	limited.BearerToken = tok.Status.Token
	d, err := kube.New(ctx(t), kube.Options{Config: limited, InitImage: kubetest.InitImage})
	if err != nil {
		t.Fatalf("kube.New: %v (the pod and PVC watches need no NetworkPolicy permission)", err)
	}
	defer d.Close()
	checkErr := d.Check(ctx(t))
	if checkErr == nil || !strings.Contains(checkErr.Error(), "NetworkPolicies") || !apierrors.IsForbidden(errors.Unwrap(checkErr)) {
		t.Fatalf("Check without NetworkPolicy permissions: %v, want a forbidden list of NetworkPolicies", checkErr)
	}
	t.Logf("Check: %v", checkErr)
}
