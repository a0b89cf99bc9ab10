// Package kubetest gives tests the real Kubernetes cluster that scripts/test.sh starts with
// tests/kubeenv (kube-apiserver, etcd, controllers, scheduler and a virtual-kubelet node
// whose pods are gVisor containers): SANDBOXD_KUBEENV names its folder. Outside CI a missing
// cluster skips the test; in CI (CI=true) it fails.
//
// The control plane under test never uses the cluster's admin identity: Gateway applies
// deploy/base's namespaces, RuntimeClass, ServiceAccount, Role and RoleBinding and returns a
// token of that ServiceAccount, so a permission deploy/ forgot fails the tests.
package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"sandboxd/internal/version"
)

// Images the cluster's node runs: scripts/test.sh builds them with scripts/build-images.sh and
// the node unpacks their OCI layouts (tagged with this version, as deploy/base runs them).
var (
	InitImage = "sandboxd/sandbox-init:" + version.Version
	BaseImage = "sandboxd/sandbox-default:" + version.Version
)

const (
	// Namespace is where the driver's pods and PVCs go (deploy/base creates it).
	Namespace = "sandbox-jobs"
	// GatewayNamespace and GatewayAccount are deploy/base's ServiceAccount of the control plane.
	GatewayNamespace = "sandbox"
	GatewayAccount   = "sandbox-gateway"
	// NativeRuntimeClass is the RuntimeClass of the node's native runtime (runc, no gVisor),
	// which `kubeenv up` creates: what a real cluster's default runtime is, for the pods that
	// are no sandbox (the kube driver's workspace reader).
	NativeRuntimeClass = "runc"
)

// Cluster is the running test cluster.
type Cluster struct {
	// Dir is kubeenv's folder; AdminKubeconfig its admin kubeconfig (system:masters).
	Dir             string
	AdminKubeconfig string
	Admin           *rest.Config
	// Kubectl is the kubectl binary built with the cluster (same version), or PATH's.
	Kubectl string
}

// Require returns the cluster, or skips (fails under CI=true) when none runs.
func Require(t testing.TB) *Cluster {
	t.Helper()
	dir := os.Getenv("SANDBOXD_KUBEENV")
	miss := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("kubetest: "+format+" (scripts/test.sh starts the cluster)", args...)
		}
		t.Skipf("kubetest: "+format+"; run the tests with scripts/test.sh for a Kubernetes cluster", args...)
	}
	if dir == "" {
		miss("SANDBOXD_KUBEENV is not set")
	}
	c := &Cluster{Dir: dir, AdminKubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	if _, err := os.Stat(filepath.Join(dir, "ready")); err != nil {
		miss("the cluster in %s is not ready: %v", dir, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.AdminKubeconfig)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	c.Admin = cfg
	c.Kubectl = os.Getenv("SANDBOXD_KUBECTL")
	if c.Kubectl == "" {
		if c.Kubectl, err = exec.LookPath("kubectl"); err != nil {
			miss("no kubectl (SANDBOXD_KUBECTL or PATH)")
		}
	}
	return c
}

// RepoRoot is the repository's root folder.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Run runs kubectl with the admin kubeconfig and stdin, returning its stdout.
func (c *Cluster) Run(stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command(c.Kubectl, append([]string{"--kubeconfig", c.AdminKubeconfig}, args...)...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// rbacKinds are the objects of deploy/base that Gateway creates for real: what the control
// plane's identity and its pods need. The rest (Deployments, Services, …) is only dry-run.
var rbacKinds = map[string]bool{"Namespace": true, "RuntimeClass": true, "ServiceAccount": true, "Role": true, "RoleBinding": true}

var applyMu sync.Mutex

// ApplyRBAC creates deploy/base's namespaces, RuntimeClass, ServiceAccount, Role and
// RoleBinding (kubectl apply, idempotent).
func (c *Cluster) ApplyRBAC(t testing.TB) {
	t.Helper()
	applyMu.Lock()
	defer applyMu.Unlock()
	rendered, err := c.Run(nil, "kustomize", filepath.Join(RepoRoot(), "deploy", "base"))
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rendered), 4096)
	var keep []string
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("kubetest: decode deploy/base: %v", err)
		}
		if obj.Object == nil || !rbacKinds[obj.GetKind()] {
			continue
		}
		b, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, string(b))
	}
	if len(keep) < len(rbacKinds) {
		t.Fatalf("kubetest: deploy/base has %d of the objects %v", len(keep), rbacKinds)
	}
	list := `{"apiVersion":"v1","kind":"List","items":[` + strings.Join(keep, ",") + `]}`
	if out, err := c.Run(strings.NewReader(list), "apply", "--server-side", "--field-manager=kubetest", "-f", "-"); err != nil {
		t.Fatalf("kubetest: %v\n%s", err, out)
	}
}

// Gateway applies deploy/base's RBAC and returns a client config, and a kubeconfig file, of
// its ServiceAccount: the identity the control plane runs as.
func (c *Cluster) Gateway(t testing.TB) (*rest.Config, string) {
	t.Helper()
	c.ApplyRBAC(t)
	cs, err := kubernetes.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secs := int64(3 * 3600)
	tok, err := cs.CoreV1().ServiceAccounts(GatewayNamespace).CreateToken(ctx, GatewayAccount,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: token for %s/%s: %v", GatewayNamespace, GatewayAccount, err)
	}
	cfg := &rest.Config{
		Host:            c.Admin.Host,
		BearerToken:     tok.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.Admin.CAData, CAFile: c.Admin.CAFile},
	}
	caData := c.Admin.CAData
	if len(caData) == 0 && c.Admin.CAFile != "" {
		if caData, err = os.ReadFile(c.Admin.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Admin.Host, CertificateAuthorityData: caData}
	kc.AuthInfos["gateway"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["gateway"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "gateway", Namespace: Namespace}
	kc.CurrentContext = "gateway"
	path := filepath.Join(t.TempDir(), "gateway.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return cfg, path
}

// Clientset is an admin clientset (for what a test does behind the control plane's back).
func (c *Cluster) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
