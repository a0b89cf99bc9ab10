package tests

import (
	"context"
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

// withReader is kubeServerOptions with the workspace reader on, its pods of runtimeClass.
func withReader(opts e2e.ServerOptions, runtimeClass string) e2e.ServerOptions {
	k := map[string]any{}
	for key, v := range opts.Extra["kube"].(map[string]any) {
		k[key] = v
	}
	k["workspace_reader"] = map[string]any{"enabled": true, "runtime_class": runtimeClass}
	extra := map[string]any{}
	for key, v := range opts.Extra {
		extra[key] = v
	}
	extra["kube"] = k
	opts.Extra = extra
	return opts
}

// TestKubeStopReadsTheVolume: with the workspace reader on, a stop releases the pod first and
// checkpoints the PVC beside it; the checkpoint holds the workspace (a link out of it as a
// link), and a sandbox made from it has it. When the reader cannot run, the stop still
// releases the compute and its slot, says why no checkpoint was taken, and keeps the
// workspace on the PVC (a start finds it); the checkpoint is owed: a destroy that cannot take
// it fails and keeps the PVC, and a control plane whose reader works takes it in the
// background (the files written after the last checkpoint are in it).
func TestKubeStopReadsTheVolume(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t)
	rs := redistest.Start(t)
	st := e2e.NewStateDir(t)
	base := kubeServerOptions(t, kubeconfig, rs.URL, st)
	s := e2e.StartServer(t, withReader(base, kubetest.NativeRuntimeClass))
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	readerGone := func(t *testing.T, id string) {
		t.Helper()
		name, _ := kube.ObjectName(id)
		e2e.Eventually(t, 30*time.Second, "the reader pod is gone", func() (bool, string) {
			_, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name+"-reader", metav1.GetOptions{})
			return apierrors.IsNotFound(err), errString(err)
		})
	}

	var id string
	e2e.Step(t, "stop-checkpoints-the-volume", func(t *testing.T) {
		id = s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrDev).SandboxID
		s.Run(t, id, []string{"sh", "-c", "mkdir -p src && echo 'the work' > src/a.txt && ln -s /etc/shadow leak && mkfifo pipe"}, e2e.HdrDev)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		sb := s.Get(t, id, e2e.HdrDev)
		if sb.State != "STOPPED" || sb.StateReason != "" || sb.LatestSnapshotID == "" {
			t.Fatalf("after the stop: %+v, want STOPPED with a snapshot and no reason", sb)
		}
		if !s.LogContains("workspace checkpointed") {
			t.Error("the server's log has no checkpoint")
		}
		readerGone(t, id)
		if q := s.Quota(t, e2e.HdrDev); q.InUse != 0 {
			t.Errorf("a stopped sandbox holds %d slots, want 0", q.InUse)
		}

		from := s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+sb.LatestSnapshotID+`"}}`, e2e.HdrDev).SandboxID
		got := s.Run(t, from, []string{"sh", "-c", "cat src/a.txt; readlink leak; test -e pipe && echo pipe || echo no-pipe"}, e2e.HdrDev)
		if got != "the work\n/etc/shadow\nno-pipe\n" {
			t.Errorf("a sandbox from the stop's snapshot has %q, want the file, the link as a link, no FIFO", got)
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+from, nil, e2e.HdrDev).Want(t, http.StatusOK)
	})

	e2e.Step(t, "destroy-running-checkpoints-the-volume", func(t *testing.T) {
		other := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrDev).SandboxID
		s.Run(t, other, []string{"sh", "-c", "echo 'last words' > final.txt"}, e2e.HdrDev)
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+other, nil, e2e.HdrDev)
		r.Want(t, http.StatusOK)
		var res e2e.SandboxJSON
		r.Decode(t, &res)
		if res.SnapshotID == "" {
			t.Fatalf("the destroy of a running sandbox answered %+v, want its final snapshot", res)
		}
		from := s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+res.SnapshotID+`"}}`, e2e.HdrDev).SandboxID
		if got := s.Run(t, from, []string{"cat", "final.txt"}, e2e.HdrDev); got != "last words\n" {
			t.Errorf("the final snapshot holds %q", got)
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+from, nil, e2e.HdrDev).Want(t, http.StatusOK)
		readerGone(t, other)
	})

	e2e.Step(t, "start-and-stop-again", func(t *testing.T) {
		before := s.Get(t, id, e2e.HdrDev).LatestSnapshotID
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if got := s.Run(t, id, []string{"cat", "src/a.txt"}, e2e.HdrDev); got != "the work\n" {
			t.Errorf("after start: %q", got)
		}
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		if sb := s.Get(t, id, e2e.HdrDev); sb.LatestSnapshotID == "" || sb.LatestSnapshotID == before {
			t.Errorf("the second stop's snapshot %q, want a new one (the first was %q)", sb.LatestSnapshotID, before)
		}
		readerGone(t, id)
	})

	// The same sandbox under a control plane whose reader cannot run.
	s.Stop(t)
	broken := e2e.StartServer(t, withReader(base, "no-such-class"))
	var lastGood string
	e2e.Step(t, "a-reader-that-cannot-run", func(t *testing.T) {
		broken.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		lastGood = broken.Get(t, id, e2e.HdrDev).LatestSnapshotID
		broken.Run(t, id, []string{"sh", "-c", "echo 'after the last checkpoint' > late.txt"}, e2e.HdrDev)
		broken.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		sb := broken.Get(t, id, e2e.HdrDev)
		if sb.State != "STOPPED" || !strings.Contains(sb.StateReason, "without a new checkpoint") || !strings.Contains(sb.StateReason, "could not read") || sb.LatestSnapshotID != lastGood {
			t.Fatalf("after the stop: %+v, want STOPPED saying no checkpoint was taken, the latest snapshot unchanged", sb)
		}
		t.Logf("reason: %s", sb.StateReason)
		if q := broken.Quota(t, e2e.HdrDev); q.InUse != 0 {
			t.Errorf("the stopped sandbox holds %d slots, want 0", q.InUse)
		}
		// A destroy owes the checkpoint and cannot take it: refused, the PVC kept.
		whenFree(t, broken, http.MethodDelete, e2e.Prefix+"/"+id).WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE")
		if sb := broken.Get(t, id, e2e.HdrDev); sb.State != "STOPPED" {
			t.Errorf("after the refused destroy: %s, want STOPPED", sb.State)
		}
		name, _ := kube.ObjectName(id)
		if _, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{}); err != nil {
			t.Errorf("the PVC after a refused destroy: %v, want it kept", err)
		}
		// A destroy of the running sandbox stops it, cannot read it, and leaves it STOPPED
		// with its checkpoint owed and its slot given back.
		whenFree(t, broken, http.MethodPost, e2e.Prefix+"/"+id+"/start").Want(t, http.StatusOK)
		broken.Run(t, id, []string{"sh", "-c", "echo 'even later' >> late.txt"}, e2e.HdrDev)
		whenFree(t, broken, http.MethodDelete, e2e.Prefix+"/"+id).WantError(t, http.StatusServiceUnavailable, "UNAVAILABLE")
		sb = broken.Get(t, id, e2e.HdrDev)
		if sb.State != "STOPPED" || !strings.Contains(sb.StateReason, "not destroyed") || sb.LatestSnapshotID != lastGood {
			t.Errorf("after a destroy that could not checkpoint: %+v, want STOPPED, not destroyed, the latest snapshot unchanged", sb)
		}
		if q := broken.Quota(t, e2e.HdrDev); q.InUse != 0 {
			t.Errorf("the stopped sandbox holds %d slots, want 0", q.InUse)
		}
	})

	broken.Stop(t)
	s = e2e.StartServer(t, withReader(base, kubetest.NativeRuntimeClass))
	e2e.Step(t, "the-reconciler-takes-the-owed-checkpoint", func(t *testing.T) {
		// A replica whose reader works takes the checkpoint in the background: the workspace
		// is in the checkpoint store again, and the reason goes.
		var sb e2e.SandboxJSON
		e2e.Eventually(t, time.Minute, "the owed checkpoint is taken", func() (bool, string) {
			sb = s.Get(t, id, e2e.HdrDev)
			return sb.StateReason == "" && sb.LatestSnapshotID != lastGood, sb.StateReason
		})
		if sb.State != "STOPPED" {
			t.Errorf("after the owed checkpoint: %s, want STOPPED", sb.State)
		}
		from := s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+sb.LatestSnapshotID+`"}}`, e2e.HdrDev).SandboxID
		if got := s.Run(t, from, []string{"cat", "late.txt"}, e2e.HdrDev); got != "after the last checkpoint\neven later\n" {
			t.Errorf("the owed checkpoint holds %q", got)
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+from, nil, e2e.HdrDev).Want(t, http.StatusOK)
		lastGood = sb.LatestSnapshotID
	})

	e2e.Step(t, "destroy-of-a-stopped-sandbox", func(t *testing.T) {
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrDev)
		r.Want(t, http.StatusOK)
		var res e2e.SandboxJSON
		r.Decode(t, &res)
		if res.SnapshotID != lastGood {
			t.Fatalf("the destroy's snapshot %q, want the latest, %q (nothing is owed any more)", res.SnapshotID, lastGood)
		}
		from := s.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+res.SnapshotID+`"}}`, e2e.HdrDev).SandboxID
		if got := s.Run(t, from, []string{"cat", "late.txt", "src/a.txt"}, e2e.HdrDev); got != "after the last checkpoint\neven later\nthe work\n" {
			t.Errorf("the destroy's snapshot holds %q, want the file written after the last checkpoint", got)
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+from, nil, e2e.HdrDev).Want(t, http.StatusOK)
		readerGone(t, id)
	})
}

// TestKubeStopKilledWhileReading: a replica killed with -9 while the reader reads a stopped
// sandbox's volume (its pod gone, no checkpoint recorded yet) leaves the sandbox STOPPING with
// its checkpoint owed on its record; the replica after it finishes the stop with a checkpoint
// that holds every file, and no reader pod is left.
func TestKubeStopKilledWhileReading(t *testing.T) {
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	cs := c.Clientset(t)
	rs := redistest.Start(t)
	st := e2e.NewStateDir(t)
	opts := withReader(kubeServerOptions(t, kubeconfig, rs.URL, st), kubetest.NativeRuntimeClass)
	a := e2e.StartServer(t, opts)
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrDev).SandboxID
	before := a.Get(t, id, e2e.HdrDev).LatestSnapshotID
	// Enough random bytes that the read lasts a while after the reader runs.
	sum := a.Run(t, id, []string{"sh", "-c", "head -c 150000000 /dev/urandom > big && echo marker > m.txt && sha256sum big | cut -d' ' -f1"}, e2e.HdrDev)
	name, _ := kube.ObjectName(id)

	go func() { _, _ = a.Send(http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev) }()
	e2e.Eventually(t, time.Minute, "the reader runs", func() (bool, string) {
		return a.LogContains("workspace reader running"), ""
	})
	a.Kill(t)
	pvc, err := cs.CoreV1().PersistentVolumeClaims(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Annotations[kube.AnnState] != "STOPPING" || !strings.Contains(pvc.Annotations[kube.AnnRecordExtra], "checkpoint_owed") {
		t.Fatalf("after the kill: state %q, annotations %s; want STOPPING with the checkpoint owed", pvc.Annotations[kube.AnnState], pvc.Annotations[kube.AnnRecordExtra])
	}

	b := e2e.StartServer(t, opts)
	b.Track(id, e2e.HdrDev)
	var sb e2e.SandboxJSON
	e2e.Eventually(t, 2*time.Minute, "the next replica finishes the stop", func() (bool, string) {
		sb = b.Get(t, id, e2e.HdrDev)
		return sb.State == "STOPPED", sb.State
	})
	if sb.StateReason != "" || sb.LatestSnapshotID == "" || sb.LatestSnapshotID == before {
		t.Fatalf("the finished stop: %+v, want a new checkpoint", sb)
	}
	from := b.Create(t, `{"profile":"sandboxes-default","source":{"snapshot_id":"`+sb.LatestSnapshotID+`"}}`, e2e.HdrDev).SandboxID
	b.Track(from, e2e.HdrDev)
	if got := b.Run(t, from, []string{"sh", "-c", "cat m.txt && sha256sum big | cut -d' ' -f1"}, e2e.HdrDev); got != "marker\n"+sum {
		t.Errorf("the finished stop's snapshot holds %q, want the marker and the big file (%q)", got, sum)
	}
	e2e.Eventually(t, 30*time.Second, "no reader pod is left", func() (bool, string) {
		_, err := cs.CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name+"-reader", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errString(err)
	})
}

// whenFree sends a request on a sandbox, again while it is busy (409: the reconciler's
// background try at its owed checkpoint holds its lock for a moment).
func whenFree(t *testing.T, s *e2e.Server, method, path string) *e2e.Response {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := s.Curl(t, method, path, nil, e2e.HdrDev)
		if r.Status != http.StatusConflict || time.Now().After(deadline) {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}
