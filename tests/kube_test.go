package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
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
			{"name": "sandboxes-default", "image": kubetest.BaseImage, "milli_cpu": 1000, "memory_mb": 1024, "disk_mb": 1024},
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

// TestDeployApplies: every object of deploy/ (base and the dev overlay) passes a server-side
// dry run against the real API server.
func TestDeployApplies(t *testing.T) {
	c := kubetest.Require(t)
	c.ApplyRBAC(t) // the namespaces must exist for a dry run of what goes into them
	for _, dir := range []string{"deploy/base", "deploy/overlays/dev"} {
		out, err := c.Run(nil, "apply", "--dry-run=server", "-k", e2e.ModuleRoot()+"/"+dir)
		if err != nil {
			t.Errorf("%s: %v\n%s", dir, err, out)
			continue
		}
		t.Logf("%s:\n%s", dir, out)
	}
}
