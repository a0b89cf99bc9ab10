package tests

import (
	"archive/tar"
	"net/http"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"sandboxd/internal/source/sourcetest"
	"sandboxd/tests/e2e"
)

// TestBootstrapSources: create from an HTTPS archive on loopback (allow-listed, its CA in the
// config) and from a permitted GCS prefix (fake-gcs-server), fetched once into the workspace
// before RUNNING; hostile archives (zip-slip, a symlink out, a device, a bomb) answer 400
// naming the entry and leave nothing (no sandbox listed, the quota's in_use unchanged); a
// loopback URL on a port that is not allow-listed and a prefix that is not permitted answer
// 400 too.
func TestBootstrapSources(t *testing.T) {
	e2e.RequireComponents(t)
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
	host, sources := e2e.ArchiveHost(t)
	sources["gcs_prefixes"] = map[string][]string{"t1:p1": {"gs://" + bucket + "/tasks/"}}
	sources["max_total_bytes"] = 8 << 20
	s := e2e.StartServer(t, e2e.ServerOptions{
		Extra: map[string]any{"quota": map[string]any{"default_limit": 3}, "sources": sources},
		Env:   gcsEnv,
	})
	key := e2e.HdrTenant1
	createBody := func(src map[string]any) []byte {
		return []byte(e2e.MustJSON(t, map[string]any{"profile": "sandboxes-default", "source": src}))
	}

	var fromArchive e2e.SandboxJSON
	e2e.Step(t, "archive-over-https", func(t *testing.T) {
		project := []sourcetest.Entry{
			sourcetest.Dir("proj/"),
			sourcetest.File("proj/README.md", "# hello\n"),
			{Name: "proj/run.sh", Type: tar.TypeReg, Body: "#!/bin/sh\necho ran\n", Mode: 0o755},
			sourcetest.File("proj/src/main.py", "print('main')\n"),
			sourcetest.Symlink("proj/main.py", "src/main.py"),
		}
		url := host.Put("/task.tar.zst", sourcetest.TarZst(t, project))
		// curl -X POST … -d '{"source":{"archive_url":"https://…/task.tar.zst"}}' $URL/sandbox/sandboxes/v1
		fromArchive = s.Create(t, string(createBody(map[string]any{"archive_url": url})), key)
		if fromArchive.StateReason != "" {
			t.Errorf("created: got state_reason %q, want none once RUNNING", fromArchive.StateReason)
		}
		if out := s.Run(t, fromArchive.SandboxID, []string{"cat", "proj/README.md", "proj/main.py"}, key); out != "# hello\nprint('main')\n" {
			t.Errorf("files: got %q", out)
		}
		if out := s.Run(t, fromArchive.SandboxID, []string{"readlink", "proj/main.py"}, key); out != "src/main.py\n" {
			t.Errorf("symlink: got %q, want %q", out, "src/main.py\n")
		}
		if out := s.Run(t, fromArchive.SandboxID, []string{"./proj/run.sh"}, key); out != "ran\n" {
			t.Errorf("executable: got %q", out)
		}
		if n := host.Hits("/task.tar.zst"); n != 1 {
			t.Errorf("requests for the archive after create and three execs: got %d, want 1", n)
		}
	})

	before := s.Quota(t, key)
	e2e.Step(t, "hostile-archives", func(t *testing.T) {
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
			r := s.Curl(t, http.MethodPost, e2e.Prefix, createBody(map[string]any{"archive_url": url}), e2e.HdrJSON, key)
			r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", c.mention...)
		}
		l := s.List(t, key)
		if len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != fromArchive.SandboxID {
			t.Errorf("after the refused creates: got %+v, want only %s", l.Sandboxes, fromArchive.SandboxID)
		}
		if q := s.Quota(t, key); q.InUse != before.InUse {
			t.Errorf("after the refused creates: got in_use %d, want %d as before", q.InUse, before.InUse)
		}
	})

	e2e.Step(t, "loopback-port-not-allow-listed", func(t *testing.T) {
		url := "https://" + e2e.FreeAddr(t) + "/task.tar"
		r := s.Curl(t, http.MethodPost, e2e.Prefix, createBody(map[string]any{"archive_url": url}), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "127.0.0.1", "loopback")
		r = s.Curl(t, http.MethodPost, e2e.Prefix, createBody(map[string]any{"archive_url": "https://169.254.169.254/latest/meta-data/"}), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "link-local")
	})

	e2e.Step(t, "gcs-prefix-permitted", func(t *testing.T) {
		sb := s.Create(t, string(createBody(map[string]any{"gcs_prefix": "gs://" + bucket + "/tasks/t1/"})), key)
		if out := s.Run(t, sb.SandboxID, []string{"cat", "README.md", "src/main.py"}, key); out != "# task one\nprint('from gcs')\n" {
			t.Errorf("files from GCS: got %q", out)
		}
	})

	e2e.Step(t, "gcs-prefix-not-permitted", func(t *testing.T) {
		other := "gs://" + bucket + "/secret/"
		r := s.Curl(t, http.MethodPost, e2e.Prefix, createBody(map[string]any{"gcs_prefix": other}), e2e.HdrJSON, key)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", other, "not permitted for this project")
		// Another tenant may not use t1:p1's prefix.
		permitted := "gs://" + bucket + "/tasks/t1/"
		r = s.Curl(t, http.MethodPost, e2e.Prefix, createBody(map[string]any{"gcs_prefix": permitted}), e2e.HdrJSON, e2e.HdrTenant2)
		r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", permitted, "not permitted for this project")
		s.GQL(t, gqlCreate, map[string]any{"in": map[string]any{"source": map[string]any{"gcsPrefix": other}}}, key).
			WantCode(t, http.StatusOK, "INVALID_ARGUMENT", "not permitted for this project")
		if l := s.List(t, e2e.HdrTenant2); len(l.Sandboxes) != 0 {
			t.Errorf("tenant 2's sandboxes: got %d, want none", len(l.Sandboxes))
		}
		if q := s.Quota(t, key); q.InUse != before.InUse+1 {
			t.Errorf("in_use: got %d, want %d (the archive's and the prefix's sandboxes)", q.InUse, before.InUse+1)
		}
	})
}
