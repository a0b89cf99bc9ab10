package tests

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// startFakeGCS starts fake-gcs-server (its JSON API on loopback, in this process) with the
// buckets; it stops when the test ends. It returns the server and the environment that points
// a sandboxd process at it (STORAGE_EMULATOR_HOST, as the storage client does against the
// real service; no credentials).
func startFakeGCS(t *testing.T, buckets ...string) (*fakestorage.Server, []string) {
	t.Helper()
	gcs, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: 0, PublicHost: "127.0.0.1",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gcs.Stop) // after the servers' cleanups, which were registered later
	for _, b := range buckets {
		gcs.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b})
	}
	u, err := url.Parse(gcs.URL())
	if err != nil {
		t.Fatal(err)
	}
	return gcs, []string{"STORAGE_EMULATOR_HOST=" + u.Host, "GOOGLE_APPLICATION_CREDENTIALS=/nonexistent"}
}

// TestCheckpointsOnGCS: with `checkpoints.store: gcs`, stop, start and destroy keep the
// workspace in GCS (fake-gcs-server's JSON API on loopback, reached through
// STORAGE_EMULATOR_HOST, as the storage client does against the real service).
func TestCheckpointsOnGCS(t *testing.T) {
	requireComponents(t)
	const bucket = "sandbox-checkpoints"
	gcs, gcsEnv := startFakeGCS(t, bucket)
	s := startServer(t, serverOptions{
		Extra: map[string]any{"checkpoints": map[string]any{"store": "gcs", "gcs_bucket": bucket, "gcs_prefix": "ckpt"}},
		Env:   gcsEnv,
	})
	objects := func(sandboxID string) []string {
		t.Helper()
		objs, _, err := gcs.ListObjectsWithOptions(bucket, fakestorage.ListOptions{Prefix: "ckpt/checkpoints/t1/p1/" + sandboxID + "/"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range objs {
			names = append(names, o.Name)
		}
		return names
	}
	complete := func(names []string) int {
		n := 0
		for _, name := range names {
			if strings.HasSuffix(name, ".json") {
				n++
			}
		}
		return n
	}

	sb := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1)
	s.track(sb.SandboxID, hdrTenant1)
	s.run(t, sb.SandboxID, []string{"bash", "-c", "mkdir -p src && echo kept-in-gcs > src/f && head -c 2000000 /dev/urandom > blob"}, hdrTenant1)

	r := s.curl(t, http.MethodPost, prefix+"/"+sb.SandboxID+"/stop", nil, hdrTenant1)
	r.want(t, http.StatusOK)
	var stopped sandboxJSON
	if err := json.Unmarshal(r.Body, &stopped); err != nil {
		t.Fatal(err)
	}
	if stopped.State != "STOPPED" || stopped.LatestSnapshotID == "" {
		t.Fatalf("stop: got %s snapshot %q, want STOPPED with a snapshot", stopped.State, stopped.LatestSnapshotID)
	}
	if got := objects(sb.SandboxID); complete(got) != 1 {
		t.Fatalf("after stop, GCS holds %q, want one complete checkpoint (data + manifest)", got)
	}

	s.curl(t, http.MethodPost, prefix+"/"+sb.SandboxID+"/start", nil, hdrTenant1).want(t, http.StatusOK)
	if got := s.run(t, sb.SandboxID, []string{"cat", "src/f"}, hdrTenant1); got != "kept-in-gcs\n" {
		t.Fatalf("after start: got %q, want %q", got, "kept-in-gcs\n")
	}

	r = s.curl(t, http.MethodDelete, prefix+"/"+sb.SandboxID, nil, hdrTenant1)
	r.want(t, http.StatusOK)
	var destroyed struct {
		SnapshotID string `json:"snapshot_id"`
	}
	if err := json.Unmarshal(r.Body, &destroyed); err != nil {
		t.Fatal(err)
	}
	if destroyed.SnapshotID == "" || destroyed.SnapshotID == stopped.LatestSnapshotID {
		t.Fatalf("destroy: got snapshot %q, want a new final one (previous %q)", destroyed.SnapshotID, stopped.LatestSnapshotID)
	}
	if got := objects(sb.SandboxID); complete(got) != 2 {
		t.Fatalf("after destroy, GCS holds %q, want two complete checkpoints", got)
	}
	s.curl(t, http.MethodGet, prefix+"/"+sb.SandboxID, nil, hdrTenant1).want(t, http.StatusNotFound)
}
