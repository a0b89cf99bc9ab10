package tests

import (
	"archive/tar"
	"net/http"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"sandboxd/internal/source/sourcetest"
)

// TestBootstrapSources: create from an HTTPS archive on loopback (allow-listed, its CA in the
// config) and from a permitted GCS prefix (fake-gcs-server), fetched once into the workspace
// before RUNNING; hostile archives (zip-slip, a symlink out, a device, a bomb) answer 400
// naming the entry and leave nothing (no sandbox listed, the quota's in_use unchanged); a
// loopback URL on a port that is not allow-listed and a prefix that is not permitted answer
// 400 too.
func TestBootstrapSources(t *testing.T) {
	requireComponents(t)
	const bucket = "e2e-sources"
	gcs, gcsEnv := startFakeGCS(t, bucket)
	for name, body := range map[string]string{
		"tasks/t1/README.md":   "# task one\n",
		"tasks/t1/src/":        "",
		"tasks/t1/src/main.py": "print('from gcs')\n",
		"secret/keys.txt":      "not for t1:p1",
	} {
		gcs.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: name}, Content: []byte(body)})
	}
	host, sources := archiveHost(t)
	sources["gcs_prefixes"] = map[string][]string{"t1:p1": {"gs://" + bucket + "/tasks/"}}
	sources["max_total_bytes"] = 8 << 20
	s := startServer(t, serverOptions{
		Extra: map[string]any{"quota": map[string]any{"default_limit": 3}, "sources": sources},
		Env:   gcsEnv,
	})
	key := hdrTenant1
	createBody := func(src map[string]any) []byte {
		return []byte(mustJSON(t, map[string]any{"profile": "sandboxes-default", "source": src}))
	}

	var fromArchive sandboxJSON
	step(t, "archive-over-https", func(t *testing.T) {
		project := []sourcetest.Entry{
			sourcetest.Dir("proj/"),
			sourcetest.File("proj/README.md", "# hello\n"),
			{Name: "proj/run.sh", Type: tar.TypeReg, Body: "#!/bin/sh\necho ran\n", Mode: 0o755},
			sourcetest.File("proj/src/main.py", "print('main')\n"),
			sourcetest.Symlink("proj/main.py", "src/main.py"),
		}
		url := host.Put("/task.tar.zst", sourcetest.TarZst(t, project))
		// curl -X POST … -d '{"source":{"archive_url":"https://…/task.tar.zst"}}' $URL/sandbox/sandboxes/v1
		fromArchive = s.create(t, string(createBody(map[string]any{"archive_url": url})), key)
		if fromArchive.StateReason != "" {
			t.Errorf("created: got state_reason %q, want none once RUNNING", fromArchive.StateReason)
		}
		if out := s.run(t, fromArchive.SandboxID, []string{"cat", "proj/README.md", "proj/main.py"}, key); out != "# hello\nprint('main')\n" {
			t.Errorf("files: got %q", out)
		}
		if out := s.run(t, fromArchive.SandboxID, []string{"readlink", "proj/main.py"}, key); out != "src/main.py\n" {
			t.Errorf("symlink: got %q, want %q", out, "src/main.py\n")
		}
		if out := s.run(t, fromArchive.SandboxID, []string{"./proj/run.sh"}, key); out != "ran\n" {
			t.Errorf("executable: got %q", out)
		}
		if n := host.Hits("/task.tar.zst"); n != 1 {
			t.Errorf("requests for the archive after create and three execs: got %d, want 1", n)
		}
	})

	before := s.quota(t, key)
	step(t, "hostile-archives", func(t *testing.T) {
		bomb := sourcetest.Gzip(t, sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("bomb.bin", strings.Repeat("\x00", 16<<20))}))
		cases := []struct {
			name    string
			archive []byte
			mention []string
		}{
			{"zip-slip", sourcetest.Zip(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.File("../evil.sh", "pwned")}),
				[]string{`"../evil.sh"`, "escapes"}},
			{"symlink-escape", sourcetest.TarGz(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.Symlink("etc", "../../../etc")}),
				[]string{`"etc"`, "outside"}},
			{"device", sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.CharDevice("dev-null")}),
				[]string{`"dev-null"`, "device"}},
			{"bomb", bomb, []string{`"bomb.bin"`, "limit"}},
		}
		for _, c := range cases {
			url := host.Put("/"+c.name, c.archive)
			r := s.curl(t, http.MethodPost, prefix, createBody(map[string]any{"archive_url": url}), hdrJSON, key)
			r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.mention...)
		}
		l := s.list(t, key)
		if len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != fromArchive.SandboxID {
			t.Errorf("after the refused creates: got %+v, want only %s", l.Sandboxes, fromArchive.SandboxID)
		}
		if q := s.quota(t, key); q.InUse != before.InUse {
			t.Errorf("after the refused creates: got in_use %d, want %d as before", q.InUse, before.InUse)
		}
	})

	step(t, "loopback-port-not-allow-listed", func(t *testing.T) {
		url := "https://" + freeAddr(t) + "/task.tar"
		r := s.curl(t, http.MethodPost, prefix, createBody(map[string]any{"archive_url": url}), hdrJSON, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "127.0.0.1", "loopback")
		r = s.curl(t, http.MethodPost, prefix, createBody(map[string]any{"archive_url": "https://169.254.169.254/latest/meta-data/"}), hdrJSON, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "link-local")
	})

	step(t, "gcs-prefix-permitted", func(t *testing.T) {
		sb := s.create(t, string(createBody(map[string]any{"gcs_prefix": "gs://" + bucket + "/tasks/t1/"})), key)
		if out := s.run(t, sb.SandboxID, []string{"cat", "README.md", "src/main.py"}, key); out != "# task one\nprint('from gcs')\n" {
			t.Errorf("files from GCS: got %q", out)
		}
	})

	step(t, "gcs-prefix-not-permitted", func(t *testing.T) {
		other := "gs://" + bucket + "/secret/"
		r := s.curl(t, http.MethodPost, prefix, createBody(map[string]any{"gcs_prefix": other}), hdrJSON, key)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", other, "not permitted for this project")
		// Another tenant may not use t1:p1's prefix.
		permitted := "gs://" + bucket + "/tasks/t1/"
		r = s.curl(t, http.MethodPost, prefix, createBody(map[string]any{"gcs_prefix": permitted}), hdrJSON, hdrTenant2)
		r.wantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", permitted, "not permitted for this project")
		s.gql(t, gqlCreate, map[string]any{"in": map[string]any{"source": map[string]any{"gcsPrefix": other}}}, key).
			wantCode(t, http.StatusOK, "INVALID_ARGUMENT", "not permitted for this project")
		if l := s.list(t, hdrTenant2); len(l.Sandboxes) != 0 {
			t.Errorf("tenant 2's sandboxes: got %d, want none", len(l.Sandboxes))
		}
		if q := s.quota(t, key); q.InUse != before.InUse+1 {
			t.Errorf("in_use: got %d, want %d (the archive's and the prefix's sandboxes)", q.InUse, before.InUse+1)
		}
	})
}
