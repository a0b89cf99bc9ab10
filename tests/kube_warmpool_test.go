package tests

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
	"sandboxd/runtime/kube"
	"sandboxd/tests/e2e"
)

// TestKubeWarmPool: on the kube runtime a warm pool is the cluster's. Two replicas (one Redis)
// with warm_pool 3 keep 3 pool boxes in all (PVCs and pods labelled sandboxd.io/pool), which
// hold nobody's slot; concurrent creates from both replicas never get the same box, every
// warm sandbox starts empty with its own caller's env and its pod relabelled as its owner's; a
// replica killed with SIGKILL leaves nothing behind that the others do not take over or delete;
// and once every sandbox is destroyed and the replicas stop, no pool box is left in the cluster.
func TestKubeWarmPool(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t).CoreV1()
	rs := redistest.Start(t)
	opts := kubeServerOptions(t, kubeconfig, rs.URL, e2e.NewStateDir(t))
	opts.Extra["profiles"] = []map[string]any{{"name": "warm", "image": kubetest.BaseImage, "image_has_init": true,
		"milli_cpu": 1000, "memory_mb": 512, "disk_mb": 1024, "warm_pool": 3, "env": map[string]string{"PROFILE_VAR": "p"}}}
	opts.Extra["default_profile"] = "warm"
	opts.Extra["quota"] = map[string]any{"default_limit": 9}
	opts.Extra["lock_ttl_sec"] = 5
	poolPVCs := func(t *testing.T) int {
		l, err := cs.PersistentVolumeClaims(kubetest.Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: kube.LabelPool})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	a, b := e2e.StartServer(t, opts), e2e.StartServer(t, opts)
	waitPool(t, a, 3)
	t.Log("the pool is the cluster's: 3 boxes for both replicas, out of lists and quotas")
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n := poolPVCs(t); n > 3 {
			t.Fatalf("pool PVCs in the cluster: %d, want at most 3 (warm_pool is per cluster)", n)
		}
	}
	if q := b.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Fatalf("quota with a full pool: %d in use, want 0", q.InUse)
	}
	if l := a.ListAll(t, e2e.HdrTenant1); len(l.Sandboxes) != 0 {
		t.Fatalf("list with only pool boxes: %d sandboxes, want 0", len(l.Sandboxes))
	}

	t.Log("6 concurrent creates from both replicas")
	const n = 6
	hdrOf := func(i int) string {
		if i >= 4 {
			return e2e.HdrTenant2
		}
		return e2e.HdrTenant1
	}
	ids := concurrentWarmCreates(t, a, b, n, hdrOf)
	for i, id := range ids {
		wantFreshWarm(t, b, id, fmt.Sprintf("c%d", i), hdrOf(i))
		name, _ := kube.ObjectName(id)
		pod, err := cs.Pods(kubetest.Namespace).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, pooled := pod.Labels[kube.LabelPool]; pooled || pod.Labels[kube.LabelTenant] == "" {
			t.Errorf("sandbox %d's pod labels %v: want its owner's, no pool label", i, pod.Labels)
		}
	}
	a.Curl(t, http.MethodGet, e2e.Prefix+"/"+ids[5], nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	if q := a.Quota(t, e2e.HdrTenant1); q.InUse != 4 {
		t.Fatalf("quota: %d in use, want 4", q.InUse)
	}

	t.Log("SIGKILL the replica that keeps the pool: the other takes its boxes over, the pool stays 3")
	waitPool(t, a, 3)
	leader, other := a, b
	if !a.LogContains("keeps the shared pools") {
		leader, other = b, a
	}
	if !leader.LogContains("keeps the shared pools") {
		t.Fatal("neither replica's log says it keeps the shared pools")
	}
	leader.Kill(t)
	c2 := e2e.StartServer(t, opts)
	e2e.Eventually(t, 2*time.Minute, "3 pool boxes, all kept by a live replica", func() (bool, string) {
		ready, all := poolGauge(t, c2, "ready"), poolPVCs(t)
		keys, _ := rs.Client.Keys(t.Context(), "*pool-owner*").Result()
		return ready == 3 && all == 3 && len(keys) == 2, fmt.Sprintf("ready %d, pool PVCs %d, owner locks %v", ready, all, keys)
	})
	if !other.LogContains("keeps the shared pools") && !c2.LogContains("keeps the shared pools") {
		t.Fatal("no live replica took the shared pools over")
	}
	sb := c2.Create(t, `{"profile":"warm","env":{"WHO":"after"}}`, e2e.HdrTenant1)
	if out := c2.Run(t, sb.SandboxID, []string{"sh", "-c", `echo "$WHO"; ls -A /workspace /tmp | grep -c mine || true`}, e2e.HdrTenant1); out != "after\n0\n" {
		t.Fatalf("a create after the kill: got %q, want the new caller's env and no file of an earlier claim", out)
	}

	for i, id := range append(ids, sb.SandboxID) {
		hdr := e2e.HdrTenant1
		if i < n {
			hdr = hdrOf(i)
		}
		c2.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, hdr).Want(t, http.StatusOK)
	}
	other.Stop(t)
	c2.Stop(t)
	e2e.Eventually(t, time.Minute, "no pool box left once every replica stopped", func() (bool, string) {
		n := poolPVCs(t)
		return n == 0, fmt.Sprintf("%d pool PVCs", n)
	})
}
