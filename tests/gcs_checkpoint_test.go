package tests

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"sandboxd/tests/e2e"
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
	e2e.RequireComponents(t)
	const bucket = "sandbox-checkpoints"
	gcs, gcsEnv := startFakeGCS(t, bucket)
	s := e2e.StartServer(t, e2e.ServerOptions{
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

	sb := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1)
	s.Track(sb.SandboxID, e2e.HdrTenant1)
	s.Run(t, sb.SandboxID, []string{"bash", "-c", "mkdir -p src && echo kept-in-gcs > src/f && head -c 2000000 /dev/urandom > blob"}, e2e.HdrTenant1)

	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sb.SandboxID+"/stop", nil, e2e.HdrTenant1)
	r.Want(t, http.StatusOK)
	var stopped e2e.SandboxJSON
	if err := json.Unmarshal(r.Body, &stopped); err != nil {
		t.Fatal(err)
	}
	if stopped.State != "STOPPED" || stopped.LatestSnapshotID == "" {
		t.Fatalf("stop: got %s snapshot %q, want STOPPED with a snapshot", stopped.State, stopped.LatestSnapshotID)
	}
	if got := objects(sb.SandboxID); complete(got) != 1 {
		t.Fatalf("after stop, GCS holds %q, want one complete checkpoint (data + manifest)", got)
	}

	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sb.SandboxID+"/start", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	if got := s.Run(t, sb.SandboxID, []string{"cat", "src/f"}, e2e.HdrTenant1); got != "kept-in-gcs\n" {
		t.Fatalf("after start: got %q, want %q", got, "kept-in-gcs\n")
	}

	r = s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1)
	r.Want(t, http.StatusOK)
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
	s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1).Want(t, http.StatusNotFound)
}
