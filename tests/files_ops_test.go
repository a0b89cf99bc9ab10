package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// The file operations (delete, move, mkdir, stat) and watches, end to end on real runsc:
// each through curl-shaped REST and GraphQL, and what a hostile workload or tenant tries.
// The watch tests are in files_watch_test.go.

// fileURL is …/{id}/files[/sub]?path=… (q: further query pairs).
func fileURL(id, sub, path string, q ...string) string {
	u := e2e.Prefix + "/" + id + "/files"
	if sub != "" {
		u += "/" + sub
	}
	v := url.Values{}
	if path != "" {
		v.Set("path", path)
	}
	for i := 0; i+1 < len(q); i += 2 {
		v.Set(q[i], q[i+1])
	}
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	return u
}

// fileInfoJSON is a file info as the files API answers it.
type fileInfoJSON struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Mode    string `json:"mode"`
	IsDir   bool   `json:"is_dir"`
	Symlink string `json:"symlink"`
	Type    string `json:"type"`
	Created *bool  `json:"created"`
}

func decodeFile(t *testing.T, r *e2e.Response) fileInfoJSON {
	t.Helper()
	var fi fileInfoJSON
	r.Decode(t, &fi)
	return fi
}

// sh runs a shell script in the sandbox (exit 0) and returns its stdout.
func sh(t *testing.T, s *e2e.Server, id, script string, headers ...string) string {
	t.Helper()
	return s.Run(t, id, []string{"bash", "-c", script}, headers...)
}

func TestFileOps(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	h := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, h).SandboxID

	e2e.Step(t, "rest", func(t *testing.T) {
		// curl -X POST "$URL/sandbox/sandboxes/v1/$ID/files/mkdir?path=src/pkg"
		r := s.Curl(t, http.MethodPost, fileURL(id, "mkdir", "src/pkg"), nil, h)
		r.Want(t, http.StatusCreated)
		if fi := decodeFile(t, r); !fi.IsDir || fi.Type != "DIRECTORY" || fi.Path != "/workspace/src/pkg" || fi.Created == nil || !*fi.Created {
			t.Errorf("%s: got %+v, want the new directory, created", r, fi)
		}
		r = s.Curl(t, http.MethodPost, fileURL(id, "mkdir", "src/pkg"), nil, h)
		r.Want(t, http.StatusOK)
		if fi := decodeFile(t, r); fi.Created == nil || *fi.Created {
			t.Errorf("%s: got %+v, want created false", r, fi)
		}
		s.Upload(t, id, "src/pkg/a.txt", []byte("hello"), h)
		s.Upload(t, id, "src/c.txt", []byte("old"), h)

		r = s.Curl(t, http.MethodGet, fileURL(id, "stat", "src/pkg/a.txt"), nil, h)
		r.Want(t, http.StatusOK)
		if fi := decodeFile(t, r); fi.Type != "FILE" || fi.Size != 5 || fi.Mode != "0644" || fi.Path != "/workspace/src/pkg/a.txt" {
			t.Errorf("%s: got %+v", r, fi)
		}

		// curl -X POST -d '{"from":"src/pkg/a.txt","to":"src/b.txt"}' "$URL/…/$ID/files/move"
		r = s.Curl(t, http.MethodPost, fileURL(id, "move", ""), []byte(`{"from":"src/pkg/a.txt","to":"src/b.txt"}`), h, e2e.HdrJSON)
		r.Want(t, http.StatusOK)
		if fi := decodeFile(t, r); fi.Path != "/workspace/src/b.txt" || fi.Size != 5 {
			t.Errorf("%s: got %+v", r, fi)
		}
		r = s.Curl(t, http.MethodPost, fileURL(id, "move", ""), []byte(`{"from":"src/b.txt","to":"src/c.txt"}`), h, e2e.HdrJSON)
		r.WantError(t, http.StatusConflict, "ALREADY_EXISTS", "/workspace/src/c.txt")
		r = s.Curl(t, http.MethodPost, fileURL(id, "move", ""), []byte(`{"from":"src/b.txt","to":"src/c.txt","overwrite":true}`), h, e2e.HdrJSON)
		r.Want(t, http.StatusOK)
		if got := s.Download(t, id, "src/c.txt", h); got != "hello" {
			t.Errorf("src/c.txt after the overwrite: got %q, want hello", got)
		}

		r = s.Curl(t, http.MethodDelete, fileURL(id, "", "src"), nil, h)
		r.WantError(t, http.StatusConflict, "DIRECTORY_NOT_EMPTY", "/workspace/src")
		// curl -X DELETE "$URL/…/$ID/files?path=src&recursive=true"
		r = s.Curl(t, http.MethodDelete, fileURL(id, "", "src", "recursive", "true"), nil, h)
		r.Want(t, http.StatusOK)
		var del map[string]any
		r.Decode(t, &del)
		if del["deleted"] != true || del["path"] != "src" {
			t.Errorf("%s: got %v", r, del)
		}
		s.Curl(t, http.MethodGet, fileURL(id, "stat", "src"), nil, h).WantError(t, http.StatusNotFound, "NOT_FOUND")
		if ls := sh(t, s, id, "ls -A /workspace", h); strings.Contains(ls, "src") {
			t.Errorf("ls -A after the delete: %q", ls)
		}
	})

	e2e.Step(t, "graphql", func(t *testing.T) {
		vars := map[string]any{"s": id}
		g := s.GQL(t, `mutation($s: ID!) { makeDirectory(sandboxId: $s, path: "g/sub") { created directory { path isDir type } } }`, vars, h)
		var mk struct {
			Created   bool
			Directory struct {
				Path, Type string
				IsDir      bool
			}
		}
		g.OK(t, "makeDirectory", &mk)
		if !mk.Created || mk.Directory.Path != "/workspace/g/sub" || mk.Directory.Type != "DIRECTORY" {
			t.Errorf("makeDirectory: got %+v", mk)
		}
		s.Upload(t, id, "g/sub/f.txt", []byte("gql"), h)
		g = s.GQL(t, `mutation($s: ID!) { moveFile(sandboxId: $s, from: "g/sub/f.txt", to: "g/f2.txt") { file { path size type } } }`, vars, h)
		var fi struct {
			Path, Type string
			Size       int64
		}
		g.OK(t, "moveFile.file", &fi)
		if fi.Path != "/workspace/g/f2.txt" || fi.Size != 3 || fi.Type != "FILE" {
			t.Errorf("moveFile: got %+v", fi)
		}
		sh(t, s, id, "ln -s /etc /workspace/g/etc", h)
		g = s.GQL(t, `query($s: ID!) { stat(sandboxId: $s, path: "g/etc") { type symlink isDir } }`, vars, h)
		var st struct {
			Type, Symlink string
			IsDir         bool
		}
		g.OK(t, "stat", &st)
		if st.Type != "SYMLINK" || st.Symlink != "/etc" || st.IsDir {
			t.Errorf("stat of a link: got %+v, want the link itself", st)
		}
		s.GQL(t, `mutation($s: ID!) { deleteFile(sandboxId: $s, path: "g") { path } }`, vars, h).WantCode(t, http.StatusOK, "DIRECTORY_NOT_EMPTY")
		s.GQL(t, `mutation($s: ID!) { moveFile(sandboxId: $s, from: "g/f2.txt", to: "g/etc") { file { path } } }`, vars, h).
			WantCode(t, http.StatusOK, "ALREADY_EXISTS")
		var deleted struct{ SandboxID, Path string }
		s.GQL(t, `mutation($s: ID!) { deleteFile(sandboxId: $s, path: "g", recursive: true) { sandboxId path } }`, vars, h).OK(t, "deleteFile", &deleted)
		if deleted.SandboxID != id || deleted.Path != "g" {
			t.Errorf("deleteFile: got %+v, want sandbox %s and path g", deleted, id)
		}
		s.GQL(t, `query($s: ID!) { stat(sandboxId: $s, path: "g") { path } }`, vars, h).WantCode(t, http.StatusOK, "NOT_FOUND")
	})

	e2e.Step(t, "another-tenant", func(t *testing.T) {
		sh(t, s, id, "mkdir -p /workspace/mine && echo x > /workspace/mine/f", h)
		h2 := e2e.HdrTenant2
		for _, r := range []*e2e.Response{
			s.Curl(t, http.MethodGet, fileURL(id, "stat", "mine/f"), nil, h2),
			s.Curl(t, http.MethodPost, fileURL(id, "mkdir", "mine/x"), nil, h2),
			s.Curl(t, http.MethodPost, fileURL(id, "move", ""), []byte(`{"from":"mine/f","to":"stolen"}`), h2, e2e.HdrJSON),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "mine", "recursive", "true"), nil, h2),
			s.Curl(t, http.MethodGet, fileURL(id, "watch", "mine"), nil, h2),
		} {
			r.WantError(t, http.StatusNotFound, "NOT_FOUND")
		}
		vars := map[string]any{"s": id}
		s.GQL(t, `query($s: ID!) { stat(sandboxId: $s, path: "mine/f") { path } }`, vars, h2).WantCode(t, http.StatusOK, "NOT_FOUND")
		s.GQL(t, `mutation($s: ID!) { deleteFile(sandboxId: $s, path: "mine", recursive: true) { path } }`, vars, h2).WantCode(t, http.StatusOK, "NOT_FOUND")
		if got := sh(t, s, id, "cat /workspace/mine/f", h); got != "x\n" {
			t.Errorf("the owner's file after another tenant's tries: got %q", got)
		}
	})
}

// hostileSetup makes, inside the sandbox, a folder outside the workspace (/tmp/outside, with
// a secret and a subfolder) and links to it, to / and to /etc from the workspace.
const hostileSetup = `set -e
mkdir -p /tmp/outside/sub && echo secret > /tmp/outside/x
cd /workspace
ln -s / root && ln -s /etc etc && ln -s /tmp/outside out
mkdir -p tree/a/b && echo 1 > tree/a/b/f && ln -s /tmp/outside tree/out && ln -s /tmp/outside/x tree/a/outx && ln -s / tree/a/b/root
mkdir d && echo in > d/f`

// outsideIntact checks, from inside the sandbox, that /tmp/outside is as hostileSetup made it.
func outsideIntact(t *testing.T, s *e2e.Server, id string, h string) {
	t.Helper()
	got := sh(t, s, id, "cat /tmp/outside/x; ls -A /tmp/outside | tr '\\n' ' '; test -d /tmp/outside/sub && echo sub-ok", h)
	if got != "secret\nsub x sub-ok\n" {
		t.Errorf("/tmp/outside: got %q, want it untouched", got)
	}
}

func TestFileOpsHostile(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	h := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, h).SandboxID
	sh(t, s, id, hostileSetup, h)
	move := func(body string) *e2e.Response {
		return s.Curl(t, http.MethodPost, fileURL(id, "move", ""), []byte(body), h, e2e.HdrJSON)
	}

	e2e.Step(t, "links-as-source-target-parent", func(t *testing.T) {
		// A link as the last component is the link itself: stat reports it, never follows it.
		for name, target := range map[string]string{"root": "/", "etc": "/etc", "out": "/tmp/outside"} {
			r := s.Curl(t, http.MethodGet, fileURL(id, "stat", name), nil, h)
			r.Want(t, http.StatusOK)
			if fi := decodeFile(t, r); fi.Type != "SYMLINK" || fi.Symlink != target || fi.IsDir {
				t.Errorf("%s: got %+v, want a link to %s", r, fi, target)
			}
		}
		// A link as a parent that leads out of the workspace is refused, whatever the verb.
		for _, r := range []*e2e.Response{
			s.Curl(t, http.MethodGet, fileURL(id, "stat", "etc/passwd"), nil, h),
			s.Curl(t, http.MethodGet, fileURL(id, "stat", "root/tmp/outside/x"), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "out/x"), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "out/sub", "recursive", "true"), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "root/tmp/outside", "recursive", "true"), nil, h),
			s.Curl(t, http.MethodPost, fileURL(id, "mkdir", "out/planted"), nil, h),
			s.Curl(t, http.MethodPost, fileURL(id, "mkdir", "etc/planted"), nil, h),
			move(`{"from":"out/x","to":"stolen"}`),
			move(`{"from":"root/tmp/outside/x","to":"stolen"}`),
			move(`{"from":"d/f","to":"out/planted"}`),
			move(`{"from":"d/f","to":"root/tmp/planted"}`),
			move(`{"from":"d/f","to":"/etc/planted"}`),
			move(`{"from":"d","to":"etc/planted"}`),
		} {
			r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		}
		// A link as the target is replaced only with overwrite, and never written through.
		move(`{"from":"d/f","to":"etc"}`).WantError(t, http.StatusConflict, "ALREADY_EXISTS")
		move(`{"from":"d/f","to":"out","overwrite":true}`).Want(t, http.StatusOK)
		if got := sh(t, s, id, "test -L /workspace/out || cat /workspace/out", h); got != "in\n" {
			t.Errorf("out after a move onto it: got %q, want the moved file in place of the link", got)
		}
		// Moving the link to / moves the link.
		move(`{"from":"root","to":"root2"}`).Want(t, http.StatusOK)
		if got := sh(t, s, id, "readlink /workspace/root2", h); got != "/\n" {
			t.Errorf("readlink root2: got %q", got)
		}
		outsideIntact(t, s, id, h)
	})

	e2e.Step(t, "refusals", func(t *testing.T) {
		long := strings.Repeat("a/", 2100)
		for _, r := range []*e2e.Response{
			s.Curl(t, http.MethodDelete, fileURL(id, "", "/workspace", "recursive", "true"), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "tree/.."), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", "../etc/passwd"), nil, h),
			move(`{"from":".","to":"x"}`),
			move(`{"from":"tree","to":"/workspace"}`),
			move(`{"from":"tree","to":"tree/a/inside"}`), // a directory into itself
			move(`{"from":"tree","to":"./tree"}`),
			move(`{"from":"tree","to":".sbx-trash-0123456789abcdef"}`), // reserved names
			s.Curl(t, http.MethodPost, fileURL(id, "mkdir", ".sbx-tmp-x"), nil, h),
			s.Curl(t, http.MethodGet, fileURL(id, "stat", long), nil, h), // over limits.max_path_bytes
			s.Curl(t, http.MethodDelete, fileURL(id, "", "x", "recursive", "maybe"), nil, h),
			s.Curl(t, http.MethodDelete, fileURL(id, "", ""), nil, h),
		} {
			r.WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		}
		move(`{"from":"tree","to":"nowhere/tree"}`).WantError(t, http.StatusNotFound, "NOT_FOUND")
		move(`{"from":"nope","to":"x"}`).WantError(t, http.StatusNotFound, "NOT_FOUND")
		move(`{"from":"a","to":"b","force":true}`).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "force")
		big := []byte(`{"from":"` + strings.Repeat("x", 9<<20) + `","to":"y"}`)
		move(string(big)).WantError(t, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
	})

	e2e.Step(t, "recursive-delete-of-a-tree-with-links-out", func(t *testing.T) {
		s.Curl(t, http.MethodDelete, fileURL(id, "", "tree", "recursive", "true"), nil, h).Want(t, http.StatusOK)
		outsideIntact(t, s, id, h)
		if got := sh(t, s, id, "ls / | tr '\\n' ' '", h); !strings.Contains(got, "etc") || !strings.Contains(got, "usr") {
			t.Errorf("ls /: got %q, want the root file system untouched", got)
		}
	})

	e2e.Step(t, "parent-swapped-for-a-link-meanwhile", func(t *testing.T) {
		// A detached command swaps p between a real folder and a link to /tmp/outside as fast as
		// it can, while REST moves, deletes and mkdirs act through p.
		// (The API's mkdir makes a missing p itself now and then: each turn starts over.)
		swap := `cd /workspace; mkdir -p p; end=$((SECONDS+8)); n=0
while [ $SECONDS -lt $end ]; do
  rm -rf p.real; mkdir -p p/sub; echo inside > p/x
  mv -T p p.real && ln -s /tmp/outside p; sleep 0.02; rm -rf p; mv -T p.real p; n=$((n+1))
done; echo $n`
		ex := detach(t, s, id, e2e.MustJSON(t, map[string]any{"command": []string{"bash", "-c", swap}, "wait": false, "timeout_sec": 60}), h)
		statuses := map[int]int{}
		var mu sync.Mutex
		deadline := time.Now().Add(6 * time.Second)
		ops := []func() (*e2e.Response, error){
			func() (*e2e.Response, error) { return s.Send(http.MethodDelete, fileURL(id, "", "p/x"), nil, h) },
			func() (*e2e.Response, error) {
				return s.Send(http.MethodDelete, fileURL(id, "", "p/sub", "recursive", "true"), nil, h)
			},
			func() (*e2e.Response, error) {
				return s.Send(http.MethodPost, fileURL(id, "move", ""), strings.NewReader(`{"from":"p/x","to":"stolen","overwrite":true}`), h, e2e.HdrJSON)
			},
			func() (*e2e.Response, error) {
				return s.Send(http.MethodPost, fileURL(id, "move", ""), strings.NewReader(`{"from":"p/sub","to":"stolen-dir","overwrite":true}`), h, e2e.HdrJSON)
			},
			func() (*e2e.Response, error) {
				return s.Send(http.MethodPost, fileURL(id, "mkdir", "p/sub/planted"), nil, h)
			},
			func() (*e2e.Response, error) {
				return s.Send(http.MethodPost, fileURL(id, "move", ""), strings.NewReader(`{"from":"d2","to":"p/planted-file"}`), h, e2e.HdrJSON)
			},
		}
		sh(t, s, id, "echo planted > /workspace/d2", h)
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Go(func() {
				for i := w; time.Now().Before(deadline); i++ {
					r, err := ops[i%len(ops)]()
					mu.Lock()
					if err != nil {
						statuses[-1]++
					} else {
						statuses[r.Status]++
						if r.Status >= 500 {
							t.Errorf("%s", r)
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		var swaps string
		e2e.Eventually(t, 30*time.Second, "the swapping command ends", func() (bool, string) {
			r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+ex.ExecID, nil, h)
			var st map[string]any
			_ = json.Unmarshal(r.Body, &st)
			swaps = fmt.Sprint(st["stdout"])
			return st["state"] == "ENDED", fmt.Sprint(st["state"])
		})
		t.Logf("answers during %s swaps: %v", strings.TrimSpace(swaps), statuses)
		if statuses[-1] > 0 {
			t.Errorf("%d requests failed to get an answer", statuses[-1])
		}
		if statuses[http.StatusBadRequest] == 0 || statuses[http.StatusOK]+statuses[http.StatusCreated] == 0 {
			t.Errorf("answers %v: want some through the link refused (400) and some inside done (200, 201)", statuses)
		}
		outsideIntact(t, s, id, h)
		if got := sh(t, s, id, "ls -A /tmp | tr '\\n' ' '; ls -A /tmp/outside/sub | wc -l", h); strings.Contains(got, "planted") || !strings.HasSuffix(got, "0\n") {
			t.Errorf("/tmp after the swaps: got %q, want nothing planted", got)
		}
		if got := sh(t, s, id, "cat /workspace/stolen 2>/dev/null || true", h); got != "" && got != "inside\n" {
			t.Errorf("stolen: got %q, want only what was inside the workspace", got)
		}
	})
}

// TestFileDeleteMillionEntries: a recursive delete of a folder of a million entries answers at
// once (the tree is moved aside and removed in the background), the sandbox keeps answering
// other calls while it goes, and the tree is gone in the end, hidden meanwhile.
func TestFileDeleteMillionEntries(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	h := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, h).SandboxID
	// 100 folders of 10,000 entries: one file and 9,999 hard links to it each (the entries a
	// delete has to remove, without a million inodes on the sandbox's disk).
	const script = `import os
n = 0
for d in range(100):
    p = '/workspace/big/d%02d' % d
    os.makedirs(p)
    src = p + '/f'
    os.close(os.open(src, os.O_CREAT | os.O_WRONLY))
    n += 1
    for i in range(1, 10000):
        os.link(src, p + '/l%d' % i)
        n += 1
print(n)`
	start := time.Now()
	res := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"python3", "-c", script}, "timeout_sec": 1200}), h)
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "1000000" {
		t.Fatalf("making the tree: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	t.Logf("made 1,000,000 entries in %v", time.Since(start))

	start = time.Now()
	s.Curl(t, http.MethodDelete, fileURL(id, "", "big", "recursive", "true"), nil, h).Want(t, http.StatusOK)
	took := time.Since(start)
	t.Logf("DELETE …/files?path=big&recursive=true answered in %v", took)
	if took > 5*time.Second {
		t.Errorf("the delete took %v, want an answer at once", took)
	}
	s.Curl(t, http.MethodGet, fileURL(id, "stat", "big"), nil, h).WantError(t, http.StatusNotFound, "NOT_FOUND")
	// While the tree is removed, the sandbox answers: files, exec, and the name is free.
	var slowest time.Duration
	for i := range 5 {
		t0 := time.Now()
		s.Curl(t, http.MethodPost, fileURL(id, "mkdir", fmt.Sprintf("big/again%d", i)), nil, h).Want(t, http.StatusCreated)
		sh(t, s, id, "true", h)
		slowest = max(slowest, time.Since(t0))
	}
	t.Logf("slowest mkdir+exec while the tree was removed: %v", slowest)
	if slowest > 5*time.Second {
		t.Errorf("a mkdir and an exec took %v while the tree was removed, want the sandbox to keep answering", slowest)
	}
	r := s.Curl(t, http.MethodGet, fileURL(id, "list", "."), nil, h)
	r.Want(t, http.StatusOK)
	if strings.Contains(string(r.Body), ".sbx-trash-") {
		t.Errorf("the listing shows the trash: %s", r.Body)
	}
	start = time.Now()
	e2e.Eventually(t, 10*time.Minute, "the tree is removed in the background", func() (bool, string) {
		out := sh(t, s, id, "ls -A /workspace", h)
		return !strings.Contains(out, ".sbx-trash-"), out
	})
	t.Logf("the background removal ended about %v after the answer", time.Since(start)+took)
}
