package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
	"sandboxd/internal/version"
	"sandboxd/runtime/kube"
	"sandboxd/tests/e2e"
)

// kubeServerOptions run sandboxd on the kube runtime as deploy/base's ServiceAccount, with a
// real redis-server (so a test can FLUSHALL it) and a quota of 4 for dev:default.
func kubeServerOptions(t *testing.T, kubeconfig, redisURL string, st *e2e.StateDir) e2e.ServerOptions {
	return e2e.ServerOptions{State: st, RedisURL: redisURL, Extra: map[string]any{
		"runtime": "kube",
		"kube": map[string]any{
			"kubeconfig":                kubeconfig,
			"init_image":                kubetest.InitImage,
			"ready_timeout_sec":         60,
			"unschedulable_timeout_sec": 5,
		},
		"profiles": []map[string]any{
			{"name": "sandboxes-default", "image": kubetest.BaseImage, "image_has_init": true, "milli_cpu": 1000, "memory_mb": 1024, "disk_mb": 1024},
		},
		"quota":                 map[string]any{"default_limit": 4},
		"reconcile_interval_ms": 300,
	}}
}

// TestKubeRuntime is the product document's flow through the REST API on the kube runtime
// (create, exec twice in the same files, stop, start, destroy), with a control-plane restart
// after a Redis FLUSHALL that finds the sandbox again from the cluster alone, and a pod deleted
// behind the control plane's back: reported FAILED with a reason, and started again on its
// workspace by the control plane.
func TestKubeRuntime(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t)
	rs := redistest.Start(t)
	st := e2e.NewStateDir(t)
	opts := kubeServerOptions(t, kubeconfig, rs.URL, st)
	s := e2e.StartServer(t, opts)
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	var id, name string

	e2e.Step(t, "create", func(t *testing.T) {
		start := time.Now()
		sb := s.Create(t, `{"profile":"sandboxes-default","autostop_sec":1800}`, e2e.HdrDev)
		id = sb.SandboxID
		name, _ = kube.ObjectName(id)
		t.Logf("created %s in %v", id, time.Since(start).Round(time.Millisecond))
		pod, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the sandbox's pod: %v", err)
		}
		if pod.Labels[kube.LabelSandboxID] != id || pod.Labels[kube.LabelTenant] != "dev" || pod.Labels[kube.LabelProject] != "default" ||
			pod.Labels[kube.LabelProfile] != "sandboxes-default" || *pod.Spec.RuntimeClassName != "gvisor" {
			t.Errorf("pod labels %v, runtime class %v", pod.Labels, *pod.Spec.RuntimeClassName)
		}
		pvc, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the sandbox's PVC: %v", err)
		}
		if pvc.Annotations[kube.AnnState] != "RUNNING" || pvc.Annotations[kube.AnnTenant] != "dev" || pvc.Annotations[kube.AnnAutostopSec] != "1800" {
			t.Errorf("PVC annotations %v, want the record (state RUNNING, tenant dev, autostop 1800)", pvc.Annotations)
		}
	})

	e2e.Step(t, "exec-twice-same-files", func(t *testing.T) {
		s.Run(t, id, []string{"sh", "-c", "echo 'first turn' > notes.txt && pwd"}, e2e.HdrDev)
		if got := s.Run(t, id, []string{"cat", "notes.txt"}, e2e.HdrDev); got != "first turn\n" {
			t.Errorf("second exec read %q, want the first's file", got)
		}
	})

	e2e.Step(t, "spawner-starts-commands", func(t *testing.T) {
		// The spawner program the images carry beside the init runs in the pod, and a
		// command it started is PID 1's child all the same.
		got := s.Run(t, id, []string{"sh", "-c", "grep PPid /proc/$$/status; cat /proc/[0-9]*/comm | grep -x spawn"}, e2e.HdrDev)
		if got != "PPid:\t1\nspawn\n" {
			t.Errorf("got %q, want the command PID 1's child and the spawner program running", got)
		}
	})

	e2e.Step(t, "stop-keeps-pvc", func(t *testing.T) {
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if sb := s.Get(t, id, e2e.HdrDev); sb.State != "STOPPED" {
			t.Fatalf("got state %s, want STOPPED", sb.State)
		}
		if _, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the pod of a stopped sandbox: got %v, want not found", err)
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{}); err != nil {
			t.Errorf("the PVC of a stopped sandbox: %v, want it kept", err)
		}
		if q := s.Quota(t, e2e.HdrDev); q.InUse != 0 {
			t.Errorf("a stopped sandbox holds %d slots, want 0", q.InUse)
		}
	})

	e2e.Step(t, "start-same-workspace", func(t *testing.T) {
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if got := s.Run(t, id, []string{"cat", "notes.txt"}, e2e.HdrDev); got != "first turn\n" {
			t.Errorf("after start read %q, want the workspace kept", got)
		}
	})

	// A control-plane restart after Redis lost everything (started from this test, not a
	// step, so the new server lives on for the steps after it).
	s.Stop(t)
	if err := rs.Client.FlushAll(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	s = e2e.StartServer(t, opts)
	s.Track(id, e2e.HdrDev)

	e2e.Step(t, "restart-after-flushall", func(t *testing.T) {
		sb := s.Get(t, id, e2e.HdrDev)
		if sb.State != "RUNNING" || sb.Profile != "sandboxes-default" {
			t.Fatalf("after a restart and FLUSHALL: %+v, want the RUNNING sandbox", sb)
		}
		if _, ok := s.List(t, e2e.HdrDev).Find(id); !ok {
			t.Errorf("the list after FLUSHALL misses %s", id)
		}
		if q := s.Quota(t, e2e.HdrDev); q.InUse != 1 {
			t.Errorf("quota after FLUSHALL: %d in use, want 1 (rebuilt from the cluster)", q.InUse)
		}
		if got := s.Run(t, id, []string{"cat", "notes.txt"}, e2e.HdrDev); got != "first turn\n" {
			t.Errorf("after the restart read %q", got)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})

	e2e.Step(t, "pod-deleted-behind-our-back", func(t *testing.T) {
		old, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		zero := int64(0)
		if err := cs.CoreV1().Pods(kubetest.Namespace).Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		// Reported: the sandbox's events say FAILED with the reason, then it is started again
		// on its kept workspace, in a new pod.
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := dialGraphQL(wctx, t, s)
		send(wctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": e2e.KeyDev})})
		if m := nextMsg(wctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
		}
		send(wctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{
			"query": gqlEventsSub, "variables": map[string]any{"id": id, "after": "0-0"}})})
		var failed *eventJSON
		for {
			m := nextMsg(wctx, t, c)
			var ev gqlEvent
			if err := json.Unmarshal(m.Payload, &ev); err != nil || ev.Data.SandboxEvents == nil {
				t.Fatalf("got %s %s, want an event", m.Type, m.Payload)
			}
			e := *ev.Data.SandboxEvents
			if e.State == "FAILED" {
				failed = &e
			}
			if failed != nil && e.State == "RUNNING" {
				break
			}
		}
		if failed.Reason == nil || !strings.Contains(*failed.Reason, "pod") {
			t.Errorf("the FAILED event's reason %v, want it to name the pod", failed.Reason)
		} else {
			t.Logf("reported: %q, then started again", *failed.Reason)
		}
		if sb := s.Get(t, id, e2e.HdrDev); sb.State != "RUNNING" {
			t.Fatalf("got %s, want RUNNING again", sb.State)
		}
		pod, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil || pod.UID == old.UID {
			t.Errorf("the sandbox's pod after the recovery: %v (uid %v, the deleted one was %v)", err, pod.UID, old.UID)
		}
		if got := s.Run(t, id, []string{"cat", "notes.txt"}, e2e.HdrDev); got != "first turn\n" {
			t.Errorf("after recovery read %q, want the workspace kept", got)
		}
		if q := s.Quota(t, e2e.HdrDev); q.InUse != 1 {
			t.Errorf("the recovered sandbox holds %d slots, want 1", q.InUse)
		}
	})

	e2e.Step(t, "destroy", func(t *testing.T) {
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrDev).Want(t, http.StatusOK)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrDev).WantError(t, http.StatusNotFound, "NOT_FOUND")
		e2e.Eventually(t, 30*time.Second, "the pod and PVC are gone", func() (bool, string) {
			_, perr := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
			_, verr := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
			return apierrors.IsNotFound(perr) && apierrors.IsNotFound(verr), "pod: " + errString(perr) + ", pvc: " + errString(verr)
		})
	})
}

func errString(err error) string {
	if err == nil {
		return "exists"
	}
	return err.Error()
}

// TestKubeUnschedulable: a profile no node can hold fails the create with the scheduler's
// reason, and gives its concurrency slot back.
func TestKubeUnschedulable(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	opts := kubeServerOptions(t, kubeconfig, "", nil)
	opts.Extra["profiles"] = []map[string]any{
		{"name": "sandboxes-default", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 1024},
		{"name": "huge", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 4 << 20},
	}
	s := e2e.StartServer(t, opts)
	r := s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"profile":"huge"}`), e2e.HdrJSON, e2e.HdrDev)
	r.WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE", "cannot be scheduled")
	if q := s.Quota(t, e2e.HdrDev); q.InUse != 0 {
		t.Errorf("a failed create holds %d slots, want 0", q.InUse)
	}
}

// TestDeployApplies: every object of deploy/ (the base, each overlay, and an overlay with the
// monitoring component, after the Prometheus Operator's two kinds are registered) passes a
// server-side dry run against the real API server.
func TestDeployApplies(t *testing.T) {
	c := kubetest.Require(t)
	c.ApplyRBAC(t) // the namespaces must exist for a dry run of what goes into them
	if out, err := c.Run(strings.NewReader(monitoringCRDs), "apply", "--server-side", "--field-manager=kubetest", "-f", "-"); err != nil {
		t.Fatalf("registering PrometheusRule and ServiceMonitor: %v\n%s", err, out)
	}
	if out, err := c.Run(nil, "wait", "--for=condition=Established", "--timeout=30s",
		"crd/prometheusrules.monitoring.coreos.com", "crd/servicemonitors.monitoring.coreos.com"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	withMonitoring := monitoringOverlay(t)
	for _, dir := range []string{"deploy/base", "deploy/overlays/dev", "deploy/overlays/gke", withMonitoring} {
		if !filepath.IsAbs(dir) {
			dir = e2e.ModuleRoot() + "/" + dir
		}
		out, err := c.Run(nil, "apply", "--dry-run=server", "-k", dir)
		if err != nil {
			t.Errorf("%s: %v\n%s", dir, err, out)
			continue
		}
		t.Logf("%s:\n%s", dir, out)
	}
}

// monitoringCRDs register the Prometheus Operator's PrometheusRule and ServiceMonitor kinds
// with an open schema, as far as a dry run of deploy/components/monitoring needs them (the
// real CRDs come with the operator; tests/monitoring_test.go checks the rules' contents).
const monitoringCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, listKind: PrometheusRuleList, plural: prometheusrules, singular: prometheusrule}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// monitoringOverlay writes an overlay of deploy/overlays/dev with the monitoring component
// (kustomize wants relative paths to both) and returns its folder.
func monitoringOverlay(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, e2e.ModuleRoot())
	if err != nil {
		t.Fatal(err)
	}
	k := "resources:\n  - " + rel + "/deploy/overlays/dev\ncomponents:\n  - " + rel + "/deploy/components/monitoring\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDeployImages: in every overlay, kustomize's images: moves the gateway's image and the
// sandboxes' images (the gateway's SANDBOXD_INIT_IMAGE and SANDBOXD_IMAGE) together, the base
// runs the images of this version (internal/version), the gateway runs as non-root, and the
// GKE overlay leaves the RuntimeClass to GKE.
func TestDeployImages(t *testing.T) {
	c := kubetest.Require(t)
	type container struct {
		Name, Image string
		Env         []struct{ Name, Value string }
	}
	type object struct {
		Kind     string
		Metadata struct{ Name string }
		Spec     struct {
			Template struct {
				Spec struct {
					SecurityContext struct{ RunAsNonRoot *bool }
					Containers      []container
				}
			}
		}
	}
	for _, tt := range []struct{ dir, registry, tag string }{
		{"deploy/base", "sandboxd/", version.Version},
		{"deploy/overlays/dev", "sandboxd/", "dev"},
		{"deploy/overlays/gke", "replace-with-your-registry/", version.Version},
	} {
		t.Run(filepath.Base(tt.dir), func(t *testing.T) {
			out, err := c.Run(nil, "kustomize", filepath.Join(e2e.ModuleRoot(), tt.dir))
			if err != nil {
				t.Fatal(err)
			}
			var gw *container
			var nonRoot *bool
			runtimeClasses := 0
			for _, doc := range strings.Split(out, "\n---\n") {
				var o object
				if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
					t.Fatal(err)
				}
				if o.Kind == "RuntimeClass" {
					runtimeClasses++
				}
				if o.Kind == "Deployment" && o.Metadata.Name == "sandbox-gateway" {
					gw = &o.Spec.Template.Spec.Containers[0]
					nonRoot = o.Spec.Template.Spec.SecurityContext.RunAsNonRoot
				}
			}
			if gw == nil {
				t.Fatal("no sandbox-gateway Deployment")
			}
			env := map[string]string{}
			for _, e := range gw.Env {
				env[e.Name] = e.Value
			}
			for what, got := range map[string]string{"image": gw.Image, "SANDBOXD_INIT_IMAGE": env["SANDBOXD_INIT_IMAGE"], "SANDBOXD_IMAGE": env["SANDBOXD_IMAGE"]} {
				name := map[string]string{"image": "sandboxd", "SANDBOXD_INIT_IMAGE": "sandbox-init", "SANDBOXD_IMAGE": "sandbox-default"}[what]
				if want := tt.registry + name + ":" + tt.tag; got != want {
					t.Errorf("%s: got %q, want %q", what, got, want)
				}
			}
			if nonRoot == nil || !*nonRoot {
				t.Errorf("the gateway's pod: got runAsNonRoot %v, want true", nonRoot)
			}
			if wantRC := map[bool]int{true: 0, false: 1}[strings.HasSuffix(tt.dir, "gke")]; runtimeClasses != wantRC {
				t.Errorf("RuntimeClasses: got %d, want %d", runtimeClasses, wantRC)
			}
		})
	}
}
