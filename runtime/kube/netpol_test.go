package kube

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// npAllows decides a destination the way a CNI enforces the policy: some egress rule whose
// peers hold the address (an ipBlock's cidr but none of its except) and whose ports hold the
// port (no ports: every port). Selector peers name pods, not addresses: they never match here.
func npAllows(np *networkingv1.NetworkPolicy, addr netip.Addr, proto corev1.Protocol, port int32) bool {
	for _, r := range np.Spec.Egress {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			if (p.Protocol == nil || *p.Protocol == proto) && (p.Port == nil || p.Port.IntVal == port) {
				portOK = true
			}
		}
		if !portOK {
			continue
		}
		for _, peer := range r.To {
			b := peer.IPBlock
			if b == nil || !netip.MustParsePrefix(b.CIDR).Contains(addr) {
				continue
			}
			if !slices.ContainsFunc(b.Except, func(e string) bool { return netip.MustParsePrefix(e).Contains(addr) }) {
				return true
			}
		}
	}
	return false
}

// checkShape is what every generated policy must be, whatever the box's policy says.
func checkShape(t *testing.T, np *networkingv1.NetworkPolicy, rec runtime.Record) {
	t.Helper()
	name, _ := ObjectName(rec.ID)
	if np.Name != name || np.Namespace != "sandbox-jobs" {
		t.Errorf("name %s/%s, want sandbox-jobs/%s", np.Namespace, np.Name, name)
	}
	want := map[string]string{LabelManagedBy: managedBy, LabelSandboxID: rec.ID}
	if got := np.Spec.PodSelector.MatchLabels; len(got) != 2 || got[LabelSandboxID] != rec.ID || got[LabelManagedBy] != managedBy || len(np.Spec.PodSelector.MatchExpressions) > 0 {
		t.Errorf("podSelector %+v, want exactly %v", np.Spec.PodSelector, want)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress", "Egress"}) {
		t.Errorf("policyTypes %v, want [Ingress Egress]", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 0 {
		t.Errorf("ingress rules %+v, want none (nothing reaches a sandbox's pod)", np.Spec.Ingress)
	}
	for i, r := range np.Spec.Egress {
		// An empty "to" is every destination; empty ports every port.
		if len(r.To) == 0 {
			t.Errorf("egress rule %d has no peers: it would allow every destination", i)
		}
		for _, p := range r.Ports {
			if p.Port == nil || p.Port.IntVal != 53 || p.EndPort != nil {
				t.Errorf("egress rule %d opens port %+v, want only 53", i, p)
			}
		}
		for _, peer := range r.To {
			if b := peer.IPBlock; b != nil {
				c := netip.MustParsePrefix(b.CIDR)
				for _, e := range b.Except {
					if ep := netip.MustParsePrefix(e); ep.Bits() <= c.Bits() || !c.Contains(ep.Addr()) {
						t.Errorf("ipBlock %s: except %s is not strictly inside (the API server refuses it)", b.CIDR, e)
					}
				}
			}
		}
	}
	for k := range np.Labels {
		if !strings.HasPrefix(k, "sandboxd.io/") && k != LabelManagedBy {
			t.Errorf("label %q on the policy: only the driver's own", k)
		}
	}
	if len(np.OwnerReferences) != 1 || np.OwnerReferences[0].Kind != "PersistentVolumeClaim" || np.OwnerReferences[0].Name != name ||
		np.OwnerReferences[0].UID != "pvc-uid" || np.OwnerReferences[0].APIVersion != "v1" {
		t.Errorf("ownerReferences %+v, want the box's PVC", np.OwnerReferences)
	}
}

func egressRecord(p runtime.NetworkPolicy) runtime.Record {
	rec := testRecord()
	p.Mode = netpolicy.ModeEgress
	rec.Spec.Network, rec.Spec.NetworkPolicy = netpolicy.ModeEgress, &p
	return rec
}

var testSettings = podSettings{namespace: "sandbox-jobs", initImage: "init:1", runtimeClass: "gvisor"}

func render(rec runtime.Record) *networkingv1.NetworkPolicy {
	name, _ := ObjectName(rec.ID)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("pvc-uid")}}
	return testSettings.newNetworkPolicy(name, rec, pvc)
}

func blocks(np *networkingv1.NetworkPolicy, rule int) []networkingv1.IPBlock {
	var out []networkingv1.IPBlock
	for _, p := range np.Spec.Egress[rule].To {
		if p.IPBlock == nil {
			out = append(out, networkingv1.IPBlock{CIDR: "<selector>"})
			continue
		}
		out = append(out, *p.IPBlock)
	}
	return out
}

func sameBlocks(t *testing.T, what string, got, want []networkingv1.IPBlock) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// TestNetworkPolicyNone: mode none, a nil policy (a record from before policies), and any
// record that is not plainly egress all get no egress rule: the pod sends nothing.
func TestNetworkPolicyNone(t *testing.T) {
	none := testRecord()
	old := testRecord()
	old.Spec.Network = ""
	egressNil := testRecord()
	egressNil.Spec.Network = netpolicy.ModeEgress
	mixed := egressRecord(runtime.NetworkPolicy{Allow: []string{"0.0.0.0/0"}})
	mixed.Spec.Network = netpolicy.ModeNone
	modeNone := egressRecord(runtime.NetworkPolicy{Allow: []string{"0.0.0.0/0"}})
	modeNone.Spec.NetworkPolicy.Mode = netpolicy.ModeNone
	for name, rec := range map[string]runtime.Record{"none": none, "old-record": old, "egress-without-policy": egressNil,
		"network-none-with-a-policy": mixed, "policy-mode-none": modeNone} {
		t.Run(name, func(t *testing.T) {
			np := render(rec)
			checkShape(t, np, rec)
			if len(np.Spec.Egress) != 0 {
				t.Errorf("egress rules %+v, want none", np.Spec.Egress)
			}
			for _, a := range []string{"1.1.1.1", "10.96.0.10", "169.254.169.254", "127.0.0.1"} {
				if npAllows(np, netip.MustParseAddr(a), corev1.ProtocolUDP, 53) {
					t.Errorf("%s:53 allowed", a)
				}
			}
			pod, err := testSettings.newPod("x", rec)
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.DNSConfig != nil || pod.Spec.DNSPolicy != "" {
				t.Errorf("pod DNS %q %+v, want the default", pod.Spec.DNSPolicy, pod.Spec.DNSConfig)
			}
		})
	}
}

// TestNetworkPolicyEgress: allowed CIDRs with the denies inside them as exceptions, the
// always-denied ranges inside an allow of everything, an allow inside one of them as a block
// of its own, pinned host addresses (never one a deny holds), DNS to the DNS peer.
func TestNetworkPolicyEgress(t *testing.T) {
	rec := egressRecord(runtime.NetworkPolicy{
		Allow:      []string{"0.0.0.0/0", "198.18.0.0/15", "10.1.2.3/32", "mirror.example.com"},
		Deny:       []string{"198.18.5.0/24", "203.0.113.0/24"},
		AlwaysDeny: netpolicy.DefaultAlwaysDeny,
		Pinned:     map[string][]string{"mirror.example.com": {"203.0.113.9", "192.0.2.7", "169.254.169.254", "10.0.0.5", "not-an-ip"}},
	})
	np := render(rec)
	checkShape(t, np, rec)
	if len(np.Spec.Egress) != 2 || len(np.Spec.Egress[0].Ports) != 0 {
		t.Fatalf("egress %+v, want the CIDR rule (all ports) and the DNS rule", np.Spec.Egress)
	}
	// The most specific first, as netpolicy.Rules orders them.
	sameBlocks(t, "the CIDR rule", blocks(np, 0), []networkingv1.IPBlock{
		{CIDR: "10.1.2.3/32"},
		{CIDR: "192.0.2.7/32"},
		{CIDR: "198.18.0.0/15", Except: []string{"198.18.5.0/24"}},
		{CIDR: "0.0.0.0/0", Except: []string{"198.18.5.0/24", "203.0.113.0/24", "192.0.0.0/24", "169.254.0.0/16", "192.168.0.0/16",
			"172.16.0.0/12", "100.64.0.0/10", "0.0.0.0/8", "10.0.0.0/8", "127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"}},
	})
	for addr, want := range map[string]bool{
		"1.1.1.1": true, "198.18.1.1": true, "198.18.5.5": false, "10.1.2.3": true, "10.1.2.4": false,
		"169.254.169.254": false, "127.0.0.1": false, "10.96.0.10": false, "192.168.1.1": false,
		"203.0.113.9": false, // pinned, but inside a deny: a name never opens a deny
		"192.0.2.7":   true,  // pinned, and no deny holds it
		"224.0.0.1":   false, "255.255.255.255": false,
	} {
		if got := npAllows(np, netip.MustParseAddr(addr), corev1.ProtocolTCP, 443); got != want {
			t.Errorf("%s:443 allowed = %v, want %v", addr, got, want)
		}
	}
	dns := np.Spec.Egress[1]
	if len(dns.To) != 1 || dns.To[0].IPBlock != nil ||
		dns.To[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "kube-system" || len(dns.To[0].NamespaceSelector.MatchLabels) != 1 ||
		dns.To[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" || len(dns.To[0].PodSelector.MatchLabels) != 1 {
		t.Errorf("DNS peer %+v, want kube-system's k8s-app=kube-dns pods", dns.To)
	}
	if len(dns.Ports) != 2 || *dns.Ports[0].Protocol != corev1.ProtocolUDP || *dns.Ports[1].Protocol != corev1.ProtocolTCP {
		t.Errorf("DNS ports %+v, want UDP and TCP 53", dns.Ports)
	}
	// Pinned addresses in a list ordered like the rules: an allow of a name is a /32 block.
	narrow := egressRecord(runtime.NetworkPolicy{
		Allow: []string{"mirror.example.com"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny,
		Pinned: map[string][]string{"mirror.example.com": {"203.0.113.9", "198.51.100.3", "169.254.169.254", "10.0.0.5"}},
	})
	np = render(narrow)
	checkShape(t, np, narrow)
	sameBlocks(t, "a name's pinned addresses", blocks(np, 0), []networkingv1.IPBlock{{CIDR: "198.51.100.3/32"}, {CIDR: "203.0.113.9/32"}})
}

// TestNetworkPolicyNoAllow: an egress policy that allows nothing (every pinned address of its
// one name denied, or no entry at all) has the DNS rule only, never a rule without peers.
func TestNetworkPolicyNoAllow(t *testing.T) {
	for name, p := range map[string]runtime.NetworkPolicy{
		"empty":             {AlwaysDeny: netpolicy.DefaultAlwaysDeny},
		"name-only-private": {Allow: []string{"internal.example.com"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny, Pinned: map[string][]string{"internal.example.com": {"10.0.0.5", "169.254.169.254"}}},
		"allow-equals-deny": {Allow: []string{"198.18.0.0/16"}, Deny: []string{"198.18.0.0/16"}},
		"name-never-pinned": {Allow: []string{"gone.example.com"}},
	} {
		t.Run(name, func(t *testing.T) {
			rec := egressRecord(p)
			np := render(rec)
			checkShape(t, np, rec)
			if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].Ports) != 2 {
				t.Fatalf("egress %+v, want the DNS rule alone", np.Spec.Egress)
			}
		})
	}
}

// TestNetworkPolicyMoreSpecificAllowWins: an allow inside a deny is more specific, so it
// decides its own addresses (the routing table's rule), and only those.
func TestNetworkPolicyMoreSpecificAllowWins(t *testing.T) {
	rec := egressRecord(runtime.NetworkPolicy{Allow: []string{"203.0.113.0/25"}, Deny: []string{"203.0.113.0/24"}})
	rules := netpolicy.PolicyRules(rec.Spec.NetworkPolicy)
	np := render(rec)
	for a, want := range map[string]bool{"203.0.113.1": true, "203.0.113.200": false} {
		addr := netip.MustParseAddr(a)
		if got := npAllows(np, addr, corev1.ProtocolTCP, 80); got != want || netpolicy.Decide(rules, addr) != want {
			t.Errorf("%s: policy allows %v, rules %v, want %v", a, got, netpolicy.Decide(rules, addr), want)
		}
	}
}

// TestNetworkPolicyDNS: resolvers named by the policy are /32 blocks on 53 only, next to the
// cluster DNS's pods (the Service address a gateway finds in its resolv.conf leads there, and
// most CNIs see the translated address), and the pod asks them (dnsPolicy None, at most
// three, Kubernetes' bound). A configured peer replaces the default; a disabled one leaves the
// addresses alone, and with no address either, no DNS rule at all.
func TestNetworkPolicyDNS(t *testing.T) {
	rec := egressRecord(runtime.NetworkPolicy{Allow: []string{"198.51.100.0/24"}, AlwaysDeny: netpolicy.DefaultAlwaysDeny,
		DNS: []string{"10.0.0.53", "192.0.2.53", "198.18.0.53", "203.0.113.53", "::1", "bad"}})
	np := render(rec)
	checkShape(t, np, rec)
	sameBlocks(t, "the DNS rule", blocks(np, 1), []networkingv1.IPBlock{
		{CIDR: "10.0.0.53/32"}, {CIDR: "192.0.2.53/32"}, {CIDR: "198.18.0.53/32"}, {CIDR: "203.0.113.53/32"}, {CIDR: "<selector>"}})
	if peer := np.Spec.Egress[1].To[4]; peer.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "kube-system" ||
		peer.PodSelector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("DNS peer %+v, want kube-system's k8s-app=kube-dns pods", peer)
	}
	for addr, want := range map[string]bool{"10.0.0.53": true, "203.0.113.53": true, "10.96.0.10": false, "1.1.1.1": false, "198.51.100.9": true} {
		if got := npAllows(np, netip.MustParseAddr(addr), corev1.ProtocolUDP, 53); got != want {
			t.Errorf("%s udp/53 allowed = %v, want %v", addr, got, want)
		}
	}
	// A resolver is reachable on 53 only, even in an always-denied range.
	if npAllows(np, netip.MustParseAddr("10.0.0.53"), corev1.ProtocolTCP, 80) {
		t.Error("a resolver's port 80 is allowed")
	}
	pod, err := testSettings.newPod("x", rec)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.DNSPolicy != corev1.DNSNone || pod.Spec.DNSConfig == nil ||
		!slices.Equal(pod.Spec.DNSConfig.Nameservers, []string{"10.0.0.53", "192.0.2.53", "198.18.0.53"}) ||
		len(pod.Spec.DNSConfig.Searches) != 0 {
		t.Errorf("pod DNS %q %+v, want None with the first three resolvers and no search domain", pod.Spec.DNSPolicy, pod.Spec.DNSConfig)
	}

	// No resolver addresses: the configured peer alone, and the pod keeps the cluster's DNS.
	s := testSettings
	s.dnsPeer = DNSPeer{Namespace: "dns", PodLabels: map[string]string{"app": "coredns", "tier": "node"}}
	rec = egressRecord(runtime.NetworkPolicy{Allow: []string{"198.51.100.0/24"}})
	name, _ := ObjectName(rec.ID)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "pvc-uid"}}
	np = s.newNetworkPolicy(name, rec, pvc)
	checkShape(t, np, rec)
	peer := np.Spec.Egress[1].To
	if len(peer) != 1 || peer[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != "dns" ||
		peer[0].PodSelector.MatchLabels["app"] != "coredns" || peer[0].PodSelector.MatchLabels["tier"] != "node" {
		t.Errorf("DNS peer %+v, want namespace dns, app=coredns,tier=node", peer)
	}
	if pod, _ := s.newPod("x", rec); pod.Spec.DNSConfig != nil {
		t.Errorf("pod DNS %+v, want the cluster's (the peer allows it)", pod.Spec.DNSConfig)
	}

	// Disabled: the addresses alone; with none, no DNS rule.
	s.dnsPeer = DNSPeer{Disabled: true}
	rec = egressRecord(runtime.NetworkPolicy{Allow: []string{"198.51.100.0/24"}, DNS: []string{"198.51.100.53"}})
	np = s.newNetworkPolicy(name, rec, pvc)
	checkShape(t, np, rec)
	sameBlocks(t, "the DNS rule, peer disabled", blocks(np, 1), []networkingv1.IPBlock{{CIDR: "198.51.100.53/32"}})
	rec = egressRecord(runtime.NetworkPolicy{Allow: []string{"198.51.100.0/24"}})
	np = s.newNetworkPolicy(name, rec, pvc)
	checkShape(t, np, rec)
	if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].Ports) != 0 {
		t.Errorf("no resolver and no peer: egress %+v, want the CIDR rule alone", np.Spec.Egress)
	}
}

// TestNetworkPolicyDecidesAsRules: for random policies the generated NetworkPolicy allows a
// destination on any port exactly when the decision list does (what the local runtime's
// nftables rules enforce), and port 53 also to the resolvers: NetworkPolicy cannot close an
// allowed CIDR's port 53.
func TestNetworkPolicyDecidesAsRules(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	prefix := func() string {
		a := netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(8))})
		if r.IntN(3) == 0 {
			a = netip.AddrFrom4([4]byte{[]byte{10, 169, 198, 172}[r.IntN(4)], byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(8))})
		}
		return netip.PrefixFrom(a, r.IntN(33)).Masked().String()
	}
	addr := func() netip.Addr {
		if r.IntN(2) == 0 {
			return netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		}
		return netip.AddrFrom4([4]byte{[]byte{10, 169, 198, 172, 1}[r.IntN(5)], byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
	}
	for range 400 {
		p := runtime.NetworkPolicy{AlwaysDeny: netpolicy.DefaultAlwaysDeny, Pinned: map[string][]string{}}
		for range r.IntN(6) {
			p.Allow = append(p.Allow, prefix())
		}
		for range r.IntN(4) {
			p.Deny = append(p.Deny, prefix())
		}
		if r.IntN(2) == 0 {
			p.Allow = append(p.Allow, "h.example.com")
			for range 3 {
				p.Pinned["h.example.com"] = append(p.Pinned["h.example.com"], addr().String())
			}
		}
		if r.IntN(2) == 0 {
			p.DNS = []string{addr().String()}
		}
		rec := egressRecord(p)
		np := render(rec)
		checkShape(t, np, rec)
		rules := netpolicy.PolicyRules(rec.Spec.NetworkPolicy)
		dns := netpolicy.DNSAddrs(rec.Spec.NetworkPolicy)
		for range 300 {
			a := addr()
			want := netpolicy.Decide(rules, a)
			if got := npAllows(np, a, corev1.ProtocolTCP, 443); got != want {
				t.Fatalf("%s:443 allowed %v, rules %v say %v", a, got, rules, want)
			}
			if got, want := npAllows(np, a, corev1.ProtocolUDP, 53), want || slices.Contains(dns, a); got != want {
				t.Fatalf("%s udp/53 allowed %v, want %v (rules %v, dns %v)", a, got, want, rules, dns)
			}
		}
	}
}

// TestNetworkPolicyLargest: the largest policy a profile and a create can make (64 allow
// entries nested around 128 denies, 16 pinned addresses per name) stays far below the API
// server's object limit (etcd's 1.5 MiB).
func TestNetworkPolicyLargest(t *testing.T) {
	np := render(egressRecord(largestPolicy()))
	b, err := json.Marshal(np)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the largest policy: %d ipBlocks, %d bytes of JSON", len(np.Spec.Egress[0].To), len(b))
	if len(b) > 512<<10 {
		t.Errorf("the largest policy is %d bytes of JSON, want at most 512 KiB", len(b))
	}
}

// TestDNSPeerConfig: the configured peer is checked (a namespace name, a few valid labels).
func TestDNSPeerConfig(t *testing.T) {
	if err := (DNSPeer{}).Validate(); err != nil {
		t.Errorf("the zero peer: %v", err)
	}
	if err := (DNSPeer{Disabled: true}).Validate(); err != nil {
		t.Errorf("a disabled peer: %v", err)
	}
	if got := (DNSPeer{}).withDefaults(); got.Namespace != "kube-system" || got.PodLabels["k8s-app"] != "kube-dns" {
		t.Errorf("defaults %+v", got)
	}
	if got := (DNSPeer{Namespace: "dns"}).withDefaults(); got.Namespace != "dns" || got.PodLabels["k8s-app"] != "kube-dns" {
		t.Errorf("a namespace alone: %+v", got)
	}
	many := map[string]string{}
	for i := range maxDNSPeerLabels + 1 {
		many[string(rune('a'+i))] = "x"
	}
	for _, bad := range []DNSPeer{
		{Namespace: "Kube_System"}, {Namespace: strings.Repeat("a", 64)},
		{PodLabels: map[string]string{"bad key!": "x"}}, {PodLabels: map[string]string{"k": "bad value!"}},
		{PodLabels: many}, {Disabled: true, Namespace: "kube-system"},
	} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "kube.dns_peer") {
			t.Errorf("Validate(%+v) = %v, want an error naming kube.dns_peer", bad, err)
		}
		if err := (Config{DNSPeer: bad}).Validate(); err == nil {
			t.Errorf("Config with dns_peer %+v: valid", bad)
		}
	}
	var c Config
	if err := yaml.UnmarshalStrict([]byte("dns_peer: {namespace: dns, pod_labels: {app: coredns}}"), &c); err != nil {
		t.Fatal(err)
	}
	if o := c.Options(nil, nil); o.DNSPeer.Namespace != "dns" || o.DNSPeer.PodLabels["app"] != "coredns" {
		t.Errorf("options %+v", o.DNSPeer)
	}
}

// TestDeployDefaultDeny: deploy/base's only policy for sandbox-jobs selects every pod and
// allows nothing either way: every sandbox's own policy is all it may do.
func TestDeployDefaultDeny(t *testing.T) {
	f, err := os.Open("../../deploy/base/networkpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkDefaultDeny(t, f)
}

// checkDefaultDeny checks the NetworkPolicies of the manifests r for sandbox-jobs (other kinds
// are skipped): one, the default deny.
func checkDefaultDeny(t *testing.T, r io.Reader) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var jobs []networkingv1.NetworkPolicy
	for {
		var np networkingv1.NetworkPolicy
		if err := dec.Decode(&np); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if np.Kind == "NetworkPolicy" && np.Namespace == "sandbox-jobs" {
			jobs = append(jobs, np)
		}
	}
	if len(jobs) != 1 {
		t.Fatalf("%d NetworkPolicies for sandbox-jobs, want the default deny alone", len(jobs))
	}
	np := jobs[0]
	if len(np.Spec.PodSelector.MatchLabels)+len(np.Spec.PodSelector.MatchExpressions) != 0 ||
		!slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress", "Egress"}) ||
		len(np.Spec.Ingress)+len(np.Spec.Egress) != 0 {
		t.Errorf("%s: %+v, want every pod, both directions, no rule", np.Name, np.Spec)
	}
}

// largestPolicy is the largest effective policy the model lets a profile and a create make:
// 64 allow entries (21 nested CIDRs holding every deny, 43 names with 16 pinned addresses
// each), 128 denies (the profile's 64 and a create's 64) and the always-denied ranges.
func largestPolicy() runtime.NetworkPolicy {
	p := runtime.NetworkPolicy{AlwaysDeny: netpolicy.DefaultAlwaysDeny, Pinned: map[string][]string{}}
	p.Allow = append(p.Allow, "0.0.0.0/0")
	for bits := 5; bits <= 24; bits++ {
		p.Allow = append(p.Allow, netip.PrefixFrom(netip.AddrFrom4([4]byte{8, 0, 0, 0}), bits).String())
	}
	for i := 0; len(p.Allow) < netpolicy.MaxEntries; i++ {
		h := "h" + string(rune('a'+i/26)) + string(rune('a'+i%26)) + ".example.com"
		p.Allow = append(p.Allow, h)
		for j := range netpolicy.MaxPinned {
			p.Pinned[h] = append(p.Pinned[h], netip.AddrFrom4([4]byte{9, byte(i), byte(j), 1}).String())
		}
	}
	for i := range 2 * netpolicy.MaxEntries {
		p.Deny = append(p.Deny, netip.AddrFrom4([4]byte{8, 0, 0, byte(i)}).String()+"/32")
	}
	return p
}

// TestNetworkPolicySelectsOnlyItsBox: a record whose caller labels claim another box's id (or
// the managed-by label) still labels its pod with its own id, so another box's policy never
// selects it, and its own policy does.
func TestNetworkPolicySelectsOnlyItsBox(t *testing.T) {
	victim := egressRecord(runtime.NetworkPolicy{Allow: []string{"0.0.0.0/0"}})
	victim.ID = "sbx_01JDQ8Z6W9X3K2M4N5P6Q7R8SA"
	hostile := testRecord()
	hostile.Labels = map[string]string{LabelSandboxID: victim.ID, LabelManagedBy: "someone", "team": "ml"}
	pod, err := testSettings.newPod("x", hostile)
	if err != nil {
		t.Fatal(err)
	}
	for rec, want := range map[*runtime.Record]bool{&victim: false, &hostile: true} {
		sel, err := metav1.LabelSelectorAsSelector(&render(*rec).Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if got := sel.Matches(labels.Set(pod.Labels)); got != want {
			t.Errorf("the policy of %s selects the hostile box's pod: %v, want %v", rec.ID, got, want)
		}
	}
}
