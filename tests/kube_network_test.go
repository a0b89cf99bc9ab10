package tests

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"sandboxd/internal/kubetest"
	"sandboxd/runtime/kube"
	"sandboxd/tests/e2e"
)

// TestKubeNetworkPolicy: on the kube runtime, through the REST API, each sandbox's effective
// network policy (its profile's, narrowed by the create, its host names resolved and pinned by
// a DNS server on a private test subnet in a namespace this test makes) becomes its own
// NetworkPolicy: the profile with 0.0.0.0/0 keeps the metadata and private ranges as
// exceptions, the listed profile's names are pinned addresses (a name resolving to the
// metadata server allows nothing), a narrowed create gets only its narrower blocks, a create
// that would widen is refused and makes no object, a none sandbox has no egress rule, the pod
// asks the configured resolver, stop keeps the policy and start finds it as it was, destroy
// deletes it. The test cluster's node does not enforce NetworkPolicy (a virtual kubelet with no
// network plugin): this checks the objects sandboxd makes, not packets; no sandbox sends any.
func TestKubeNetworkPolicy(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t)
	n := netSubnetOctet(100)
	sub := fmt.Sprintf("198.18.%d", n)
	dns := e2e.StartNetHost(t, sub+".0/24", []int{2}, map[string]string{
		"mirror.sandboxd.test": fmt.Sprintf("198.19.%d.9", n), "meta.sandboxd.test": "169.254.169.254"})
	resolver := dns.Addrs[0].String()

	opts := kubeServerOptions(t, kubeconfig, "", nil)
	opts.Extra["profiles"] = []map[string]any{
		{"name": "sandboxes-default", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 512, "disk_mb": 256},
		{"name": "open", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 512, "disk_mb": 256,
			"network": "egress", "egress_allow": []string{"0.0.0.0/0"}},
		{"name": "listed", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 512, "disk_mb": 256,
			"network": "egress", "egress_allow": []string{sub + ".0/24", "mirror.sandboxd.test", "meta.sandboxd.test", "10.1.2.3"},
			"egress_deny": []string{sub + ".128/25"}},
	}
	opts.Extra["network"] = map[string]any{"dns_servers": []string{resolver}}
	s := e2e.StartServer(t, opts)

	dnsRule := fmt.Sprintf(`
  - to:
      - ipBlock: {cidr: %s/32}
      - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
        podSelector: {matchLabels: {k8s-app: kube-dns}}
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]`, resolver)
	for _, tc := range []struct {
		name, body string
		egress     string // the spec's egress rules; "" for none
	}{
		{"none", `{}`, ""},
		{"none-on-an-egress-profile", `{"profile":"open","network":{"mode":"none"}}`, ""},
		{"open", `{"profile":"open"}`, `
  - to:
      - ipBlock:
          cidr: 0.0.0.0/0
          except: [192.0.0.0/24, 169.254.0.0/16, 192.168.0.0/16, 172.16.0.0/12, 100.64.0.0/10, 0.0.0.0/8, 10.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4, 240.0.0.0/4]` + dnsRule},
		{"listed", `{"profile":"listed"}`, fmt.Sprintf(`
  - to:
      - ipBlock: {cidr: 10.1.2.3/32}
      - ipBlock: {cidr: 198.19.%d.9/32}
      - ipBlock: {cidr: %s.0/24, except: [%s.128/25]}`, n, sub, sub) + dnsRule},
		{"narrowed", fmt.Sprintf(`{"profile":"listed","network":{"mode":"egress","egress_allow":["%s.0/26"],"egress_deny":["%s.16/28"]}}`, sub, sub), fmt.Sprintf(`
  - to:
      - ipBlock: {cidr: %s.0/26, except: [%s.16/28]}`, sub, sub) + dnsRule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := s.Create(t, tc.body, e2e.HdrDev)
			np := kubePolicy(t, cs, sb.SandboxID)
			want := fmt.Sprintf(`
podSelector: {matchLabels: {app.kubernetes.io/managed-by: sandboxd, sandboxd.io/sandbox-id: %s}}
policyTypes: [Ingress, Egress]`, sb.SandboxID)
			if tc.egress != "" {
				want += "\negress:" + tc.egress
			}
			var wantSpec networkingv1.NetworkPolicySpec
			if err := yaml.UnmarshalStrict([]byte(want), &wantSpec); err != nil {
				t.Fatalf("the test's expectation: %v", err)
			}
			if got, w := toYAML(t, np.Spec), toYAML(t, wantSpec); got != w {
				t.Errorf("sandbox %s's NetworkPolicy:\n%s\nwant:\n%s", sb.SandboxID, got, w)
			}
			pod := kubePod(t, cs, sb.SandboxID)
			if tc.egress != "" && (pod.Spec.DNSPolicy != corev1.DNSNone || pod.Spec.DNSConfig == nil || !slices.Equal(pod.Spec.DNSConfig.Nameservers, []string{resolver})) {
				t.Errorf("the pod's DNS: %q %+v, want None with %s", pod.Spec.DNSPolicy, pod.Spec.DNSConfig, resolver)
			}
			if tc.name == "listed" {
				show := networkingv1.NetworkPolicy{
					TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
					ObjectMeta: metav1.ObjectMeta{Name: np.Name, Namespace: np.Namespace, Labels: np.Labels, OwnerReferences: np.OwnerReferences},
					Spec:       np.Spec,
				}
				t.Logf("sandbox %s (profile listed), its NetworkPolicy as stored:\n%s", sb.SandboxID, toYAML(t, show))
			}
			r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrDev)
			r.Want(t, http.StatusOK)
			if _, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Get(ctxKube(t), objectName(t, sb.SandboxID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("after destroy the NetworkPolicy: %v, want NotFound", err)
			}
		})
	}

	t.Run("widening-is-refused", func(t *testing.T) {
		before := kubePolicyCount(t, cs)
		for _, body := range []string{
			`{"profile":"listed","network":{"mode":"egress","egress_allow":["0.0.0.0/0"]}}`,
			`{"profile":"listed","network":{"mode":"egress","egress_allow":["169.254.169.254/32"]}}`,
			`{"profile":"open","network":{"mode":"egress","egress_allow":["10.0.0.0/8"]}}`,
			`{"profile":"sandboxes-default","network":{"mode":"egress","egress_allow":["198.18.0.0/15"]}}`,
		} {
			r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(body), e2e.HdrJSON, e2e.HdrDev)
			r.WantError(t, http.StatusForbidden, "PERMISSION_DENIED", "")
		}
		if after := kubePolicyCount(t, cs); after != before {
			t.Errorf("refused creates left NetworkPolicies: %d before, %d after", before, after)
		}
	})

	t.Run("stop-keeps-start-finds", func(t *testing.T) {
		sb := s.Create(t, `{"profile":"listed"}`, e2e.HdrDev)
		np := kubePolicy(t, cs, sb.SandboxID)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sb.SandboxID+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if kept := kubePolicy(t, cs, sb.SandboxID); kept.ResourceVersion != np.ResourceVersion {
			t.Errorf("stop changed the policy (resourceVersion %s → %s)", np.ResourceVersion, kept.ResourceVersion)
		}
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sb.SandboxID+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if again := kubePolicy(t, cs, sb.SandboxID); again.ResourceVersion != np.ResourceVersion || toYAML(t, again.Spec) != toYAML(t, np.Spec) {
			t.Errorf("start rewrote an unchanged policy:\n%s", toYAML(t, again.Spec))
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrDev).Want(t, http.StatusOK)
	})
}

func ctxKube(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func objectName(t *testing.T, id string) string {
	t.Helper()
	name, err := kube.ObjectName(id)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func kubePolicy(t *testing.T, cs kubernetes.Interface, id string) *networkingv1.NetworkPolicy {
	t.Helper()
	np, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).Get(ctxKube(t), objectName(t, id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the NetworkPolicy of %s: %v", id, err)
	}
	return np
}

func kubePod(t *testing.T, cs kubernetes.Interface, id string) *corev1.Pod {
	t.Helper()
	pod, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctxKube(t), objectName(t, id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod of %s: %v", id, err)
	}
	return pod
}

func kubePolicyCount(t *testing.T, cs kubernetes.Interface) int {
	t.Helper()
	l, err := cs.NetworkingV1().NetworkPolicies(kubetest.Namespace).List(ctxKube(t), metav1.ListOptions{LabelSelector: kube.LabelManagedBy + "=sandboxd"})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

func toYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
