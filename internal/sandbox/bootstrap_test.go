package sandbox_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/internal/source"
	"sandboxd/internal/source/sourcetest"
	"sandboxd/runtime"
)

// sourceEnv is a domaintest.Env whose fetcher trusts srv and allow-lists its host:port; opts may
// adjust the fetcher's options.
func sourceEnv(t *testing.T, srv *sourcetest.Server, limit int, opts source.Options) *domaintest.Env {
	t.Helper()
	opts.RootCAs = srv.Pool()
	if opts.AllowHosts == nil {
		opts.AllowHosts = []string{srv.Host()}
	}
	f, err := source.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return domaintest.New(t, domaintest.Options{Limit: limit, Deps: func(d *domain.Deps) { d.Sources = f }})
}

// project is a tree of files, a folder and a relative symlink, as an archive holds them.
var project = []sourcetest.Entry{
	sourcetest.Dir("proj/"),
	sourcetest.File("proj/README.md", "# hello\n"),
	{Name: "proj/run.sh", Type: tar.TypeReg, Body: "#!/bin/sh\necho ran\n", Mode: 0o755},
	sourcetest.File("proj/src/main.py", "print('main')\n"),
	sourcetest.Symlink("proj/main.py", "src/main.py"),
}

// wantProject fails the test unless the sandbox's workspace holds project.
func wantProject(t *testing.T, e *domaintest.Env, id string) {
	t.Helper()
	if res := e.MustExec(t, alice, id, "cat", "proj/README.md", "proj/main.py"); string(res.Stdout) != "# hello\nprint('main')\n" {
		t.Errorf("files: got %q, want the README and main.py through its link", res.Stdout)
	}
	if res := e.MustExec(t, alice, id, "readlink", "proj/main.py"); string(res.Stdout) != "src/main.py\n" {
		t.Errorf("symlink: got %q, want %q", res.Stdout, "src/main.py\n")
	}
	if res := e.MustExec(t, alice, id, "./proj/run.sh"); string(res.Stdout) != "ran\n" {
		t.Errorf("executable: got %q (exit %d), want %q", res.Stdout, res.ExitCode, "ran\n")
	}
}

// noSandboxLeft fails the test unless alice has no sandbox, no box exists and no slot is held.
func noSandboxLeft(t *testing.T, e *domaintest.Env) {
	t.Helper()
	ctx := context.Background()
	boxes, _ := e.Fake.List(ctx)
	page, _ := e.Svc.List(ctx, alice, ListOptions{})
	if len(boxes) != 0 || len(page.Sandboxes) != 0 {
		t.Errorf("after a refused create: %d boxes, %d listed, want none", len(boxes), len(page.Sandboxes))
	}
	if u := e.Usage(t); u.InUse != 0 {
		t.Errorf("after a refused create: got %d slots in use, want 0", u.InUse)
	}
}

func TestCreateFromArchive(t *testing.T) {
	srv := sourcetest.NewServer(t)
	e := sourceEnv(t, srv, 0, source.Options{})
	ctx := context.Background()
	for _, f := range sourcetest.Formats {
		t.Run(f.Name, func(t *testing.T) {
			path := "/task." + f.Name
			url := srv.Put(path, f.Build(t, project))
			sb, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{ArchiveURL: url}})
			if err != nil {
				t.Fatalf("create from %s: %v", url, err)
			}
			if sb.State != Running || sb.StateReason != "" {
				t.Fatalf("create: got %s %q, want RUNNING without a reason", sb.State, sb.StateReason)
			}
			wantProject(t, e, sb.ID)
			box, err := e.Fake.Get(ctx, sb.ID)
			if err != nil || box.Record.Annotations[AnnSourceArchive] != url {
				t.Fatalf("record: got annotations %v (%v), want %s = %s", box.Record.Annotations, err, AnnSourceArchive, url)
			}
			// Stop and start restore from the checkpoint: the archive is fetched once.
			if _, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Svc.Start(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
			wantProject(t, e, sb.ID)
			if n := srv.Hits(path); n != 1 {
				t.Errorf("requests for the archive across create, exec, stop and start: got %d, want 1", n)
			}
			if _, err := e.Svc.Destroy(ctx, alice, sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCreateFromHostileArchive(t *testing.T) {
	srv := sourcetest.NewServer(t)
	// A small content limit, so that the bomb needs little memory to build.
	e := sourceEnv(t, srv, 1, source.Options{MaxTotalBytes: 1 << 20})
	ctx := context.Background()
	bomb := sourcetest.Gzip(t, sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("bomb.bin", strings.Repeat("\x00", 4<<20))}))
	tests := []struct {
		name    string
		archive []byte
		entry   string
		mention string
	}{
		{"zip-slip", sourcetest.Zip(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.File("../evil.sh", "pwned")}),
			"../evil.sh", "escapes"},
		// Refused midway: the entries before it reached the import, which discards them.
		{"symlink-escape", sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.Symlink("etc", "../../etc")}),
			"etc", "outside"},
		{"device", sourcetest.TarZst(t, []sourcetest.Entry{sourcetest.File("ok.txt", "fine"), sourcetest.CharDevice("null")}),
			"null", "device"},
		{"bomb", bomb, "bomb.bin", "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := srv.Put("/"+tt.name, tt.archive)
			_, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{ArchiveURL: url}})
			ae := apierror.From(err)
			if ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, fmt.Sprintf("%q", tt.entry)) ||
				!strings.Contains(ae.Message, tt.mention) || ae.Details["entry"] != tt.entry {
				t.Fatalf("got %v (details %v), want INVALID_ARGUMENT naming entry %q and saying %q", err, ae.Details, tt.entry, tt.mention)
			}
			if ae.Details["field"] != "source.archive_url" {
				t.Errorf("got details %v, want field source.archive_url", ae.Details)
			}
			noSandboxLeft(t, e)
		})
	}
	// Nothing was written anywhere in the fake runtime's folder (every box's workspace and
	// state lives there), and the project's one slot is free again.
	root := filepath.Dir(filepath.Dir(filepath.Dir(e.Fake.Workspace("x"))))
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (d.Name() == "evil.sh" || d.Name() == "ok.txt" || d.Name() == "bomb.bin") {
			t.Errorf("found %s after the refused creates", p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); err != nil {
		t.Fatalf("create after the refused ones: %v", err)
	}
}

// A URL the fetcher refuses (loopback, not allow-listed) is refused before a slot is taken or a
// box made: the project's only slot is held, the driver would fail, the server sees nothing.
func TestCreateFromRefusedURLSpendsNothing(t *testing.T) {
	srv := sourcetest.NewServer(t)
	url := srv.Put("/task.zip", sourcetest.Zip(t, project))
	e := sourceEnv(t, srv, 1, source.Options{AllowHosts: []string{}})
	ctx := context.Background()
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	e.Fake.FailNext("Create", errors.New("the driver must not be asked"))
	defer e.Fake.FailNext("Create", nil)
	_, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{ArchiveURL: url}})
	if ae := apierror.From(err); ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, "loopback") {
		t.Fatalf("got %v, want INVALID_ARGUMENT about a loopback address (not QUOTA_EXCEEDED, not the driver's error)", err)
	}
	if n := srv.Hits("/task.zip"); n != 0 {
		t.Errorf("requests to the refused host: got %d, want 0", n)
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 1 {
		t.Errorf("got %d boxes, want only the first sandbox's", len(boxes))
	}
}

func TestCreateSourceArgumentsRefused(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	tests := []struct {
		name    string
		src     Source
		mention string
	}{
		{"http", Source{ArchiveURL: "http://storage.example/task.zip"}, "only https"},
		{"file", Source{ArchiveURL: "file:///etc/passwd"}, `"file"`},
		{"metadata", Source{ArchiveURL: "https://169.254.169.254/latest/meta-data/"}, "link-local"},
		{"too-long", Source{ArchiveURL: "https://storage.example/" + strings.Repeat("a", 5000)}, "at most 4096"},
		{"gcs-malformed", Source{GCSPrefix: "gs://b/p/"}, "valid bucket"},
		{"gcs-dotdot", Source{GCSPrefix: "gs://src-bucket/tasks/../x/"}, `".."`},
		{"gcs-not-permitted", Source{GCSPrefix: "gs://src-bucket/tasks/"}, `"gs://src-bucket/tasks/" is not permitted for this project`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &tt.src})
			if ae := apierror.From(err); ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, tt.mention) {
				t.Fatalf("got %v, want INVALID_ARGUMENT mentioning %q", err, tt.mention)
			}
		})
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 0 {
		t.Fatalf("got %d boxes after refused creates, want none", len(boxes))
	}
}

// A fetch that fails (here the server answers 503) fails the create with UNAVAILABLE and the
// server's Retry-After, and leaves nothing.
func TestCreateFromUnavailableArchive(t *testing.T) {
	srv := sourcetest.NewServer(t)
	url := srv.Handle("/busy.tar.zst", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		http.Error(w, "try later", http.StatusServiceUnavailable)
	})
	e := sourceEnv(t, srv, 1, source.Options{})
	_, err := e.Svc.Create(context.Background(), alice, CreateRequest{Source: &Source{ArchiveURL: url}})
	if ae := apierror.From(err); ae.Code != apierror.Unavailable || ae.RetryAfter != 7*time.Second {
		t.Fatalf("got %v (retry after %v), want UNAVAILABLE with a retry after 7s", err, ae.RetryAfter)
	}
	noSandboxLeft(t, e)
}

// While an archive streams, the sandbox's state_reason and BOOTSTRAP_PROGRESS events say how
// far it is, naming the URL without its user info, path or query.
func TestBootstrapProgress(t *testing.T) {
	srv := sourcetest.NewServer(t)
	big := strings.Repeat("0123456789abcdef", 1<<17) // 2 MiB
	whole := sourcetest.Tar(t, []sourcetest.Entry{sourcetest.File("first.bin", big), sourcetest.File("second.txt", "done\n")})
	release := make(chan struct{})
	srv.Handle("/slow.tar", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(whole)))
		half := 512 + len(big) + 1024 // first.bin whole, and a little more
		w.Write(whole[:half])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Write(whole[half:])
	})
	e := sourceEnv(t, srv, 0, source.Options{})
	SetProgressEvery(e.Svc.Core, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	evs, err := domaintest.Events(ctx, e.Svc, alice, "", "0-0")
	if err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(srv.URL, "https://", "https://user:pa55word@", 1) + "/slow.tar?token=hunter2"
	type result struct {
		sb  Sandbox
		err error
	}
	done := make(chan result, 1)
	go func() {
		sb, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{ArchiveURL: url}})
		done <- result{sb, err}
	}()
	wantReason := "bootstrapping from https://" + srv.Host() + "/…: "
	var seen string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		page, err := e.Svc.List(ctx, alice, ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Sandboxes) == 1 {
			seen = page.Sandboxes[0].StateReason
			if page.Sandboxes[0].State == Creating && strings.HasPrefix(seen, wantReason) && strings.HasSuffix(seen, " MB read") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("state_reason while the archive streams: last saw %q, want %q and the MB read", seen, wantReason)
		}
	}
	close(release)
	res := <-done
	if res.err != nil || res.sb.State != Running || res.sb.StateReason != "" {
		t.Fatalf("create: got %s %q %v, want RUNNING without a reason", res.sb.State, res.sb.StateReason, res.err)
	}
	if got := e.MustExec(t, alice, res.sb.ID, "cat", "second.txt"); string(got.Stdout) != "done\n" {
		t.Fatalf("second.txt: got %q", got.Stdout)
	}
	var progress []Event
	for ev := range evs {
		if ev.Type == EventBootstrapProgress {
			progress = append(progress, ev)
		}
		if ev.Type == EventStateChanged && ev.State == Running {
			break
		}
	}
	if len(progress) < 2 || progress[0].BytesRead != 0 {
		t.Fatalf("progress events: got %+v, want one at 0 bytes when it begins, then more", progress)
	}
	for i, ev := range progress {
		if i > 0 && ev.BytesRead <= progress[i-1].BytesRead {
			t.Errorf("progress event %d: got %d bytes read after %d, want more", i, ev.BytesRead, progress[i-1].BytesRead)
		}
		if ev.State != Creating || !strings.HasPrefix(ev.Reason, "bootstrapping from https://"+srv.Host()+"/…") || ev.SandboxID != res.sb.ID {
			t.Errorf("progress event: got %+v, want CREATING with the redacted URL", ev)
		}
	}
	for _, s := range append([]string{seen}, progress[len(progress)-1].Reason) {
		for _, secret := range []string{"pa55word", "user", "hunter2", "slow.tar"} {
			if strings.Contains(s, secret) {
				t.Errorf("reason %q shows %q", s, secret)
			}
		}
	}
}

// fakeGCS starts fake-gcs-server in process on loopback with objects in bucket src-bucket and
// returns a lister over it.
func fakeGCS(t *testing.T, objs map[string]string) source.ObjectLister {
	t.Helper()
	_, client := sourcetest.FakeGCS(t, "src-bucket", objs)
	l, err := source.NewGCSLister(t.Context(), client)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestCreateFromGCSPrefix(t *testing.T) {
	lister := fakeGCS(t, map[string]string{
		"tasks/t1/README.md":      "# task\n",
		"tasks/t1/src/":           "",
		"tasks/t1/src/main.py":    "print('main')\n",
		"tasks/t1-evil/steal.txt": "not under the prefix",
		"secret/keys.txt":         "not permitted",
	})
	e := domaintest.New(t, domaintest.Options{Limit: 1,
		Config: func(c *Config) { c.SourcePrefixes = map[string][]string{"t1:p1": {"gs://src-bucket/tasks/"}} },
		Deps:   func(d *domain.Deps) { d.SourceObjects = lister },
	})
	ctx := context.Background()
	refused := []struct {
		name   string
		who    string
		prefix string
	}{
		{"other-prefix", "alice", "gs://src-bucket/secret/"},
		{"sibling-prefix", "alice", "gs://src-bucket/tasks-evil/"},
		{"other-bucket", "alice", "gs://other-bucket/tasks/"},
		{"other-tenant", "bob", "gs://src-bucket/tasks/t1/"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			p := alice
			if tt.who == "bob" {
				p = bob
			}
			_, err := e.Svc.Create(ctx, p, CreateRequest{Source: &Source{GCSPrefix: tt.prefix}})
			if ae := apierror.From(err); ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, tt.prefix) ||
				!strings.Contains(ae.Message, "not permitted for this project") {
				t.Fatalf("got %v, want INVALID_ARGUMENT naming %s as not permitted for this project", err, tt.prefix)
			}
		})
	}
	// A permitted prefix without objects is refused after the box was made: nothing is left.
	_, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{GCSPrefix: "gs://src-bucket/tasks/none/"}})
	if ae := apierror.From(err); ae.Code != apierror.InvalidArgument || !strings.Contains(ae.Message, "no objects") {
		t.Fatalf("an empty permitted prefix: got %v, want INVALID_ARGUMENT about no objects", err)
	}
	noSandboxLeft(t, e)

	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Source: &Source{GCSPrefix: "gs://src-bucket/tasks/t1/"}})
	if err != nil {
		t.Fatalf("create from a permitted prefix: %v", err)
	}
	if res := e.MustExec(t, alice, sb.ID, "sh", "-c", "cat README.md src/main.py; ls -A"); string(res.Stdout) != "# task\nprint('main')\nREADME.md\nsrc\n" {
		t.Fatalf("workspace: got %q", res.Stdout)
	}
}

// A create from an archive whose replica died before RUNNING is finished by the reconciler,
// which fetches the archive again rather than leaving the sandbox RUNNING empty.
func TestReconcilerFinishesACreateFromArchive(t *testing.T) {
	srv := sourcetest.NewServer(t)
	url := srv.Put("/task.tar.gz", sourcetest.TarGz(t, project))
	e := sourceEnv(t, srv, 0, source.Options{})
	ctx := context.Background()
	now := e.Clock.Now().UTC()
	rec := runtime.Record{ID: NewID("sbx_"), Tenant: alice.Tenant, Project: alice.Project, Spec: runtime.BoxSpec{Profile: "p"},
		State: string(Creating), DesiredState: string(Running), CreatedAt: now, StateChangedAt: now,
		Annotations: map[string]string{AnnSourceArchive: url}}
	if err := e.Store.Put(ctx, EntryOf(runtime.Box{Record: rec})); err != nil {
		t.Fatal(err)
	}
	if err := e.Fake.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.Svc.Get(ctx, alice, rec.ID)
	if err != nil || got.State != Running {
		t.Fatalf("got %s %q %v, want RUNNING", got.State, got.StateReason, err)
	}
	wantProject(t, e, rec.ID)
	if n := srv.Hits("/task.tar.gz"); n != 1 {
		t.Errorf("requests: got %d, want 1", n)
	}
}

// noObjects is an ObjectLister of an empty bucket.
type noObjects struct{}

func (noObjects) Objects(context.Context, string, string) iter.Seq2[source.Object, error] {
	return func(func(source.Object, error) bool) {}
}

func (noObjects) Open(context.Context, string, string, int64) (io.ReadCloser, error) {
	return nil, source.ErrObjectNotExist
}

func TestSourcePrefixesConfig(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	tests := []struct {
		name     string
		prefixes map[string][]string
		lister   bool
		want     string // "" for no error
	}{
		{"ok", map[string][]string{"t1:p1": {"gs://src-bucket/x/", "gs://whole-bucket"}}, true, ""},
		{"none-needs-no-lister", nil, false, ""},
		{"bad-scope", map[string][]string{"t1": {"gs://src-bucket/x/"}}, true, "tenant:project"},
		{"bad-scope-id", map[string][]string{"t1:p 1": {"gs://src-bucket/x/"}}, true, "tenant:project"},
		{"bad-prefix", map[string][]string{"t1:p1": {"s3://src-bucket/x/"}}, true, "gs://"},
		{"dotdot", map[string][]string{"t1:p1": {"gs://src-bucket/../x/"}}, true, `".."`},
		{"no-lister", map[string][]string{"t1:p1": {"gs://src-bucket/x/"}}, false, "object lister"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := e.Config
			cfg.SourcePrefixes = tt.prefixes
			d := e.NewDeps()
			if tt.lister {
				d.SourceObjects = noObjects{}
			}
			svc, err := domain.New(cfg, d)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				svc.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
