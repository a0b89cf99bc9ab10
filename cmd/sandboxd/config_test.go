package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"sigs.k8s.io/yaml"

	"sandboxd/internal/auth"
	"sandboxd/internal/source"
)

// load loads a config file with yaml as its content, with the settings every config needs.
func load(t *testing.T, yaml string) (Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SANDBOX_API_KEY": "a-long-dev-key", "SANDBOXD_RUNSC": "/bin/true",
		"SANDBOXD_INIT": "/bin/true", "SANDBOXD_ROOTFS": "/"}
	return loadConfig([]string{"--config", p}, func(k string) string { return env[k] })
}

// caFile writes a test server's certificate as PEM and returns the file.
func caFile(t *testing.T) string {
	t.Helper()
	srv := httptest.NewTLSServer(nil)
	srv.Close()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSourcesConfigDefaults(t *testing.T) {
	c, err := load(t, "{}\n")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.Sources.Options()
	if err != nil {
		t.Fatal(err)
	}
	if opts.MaxDownloadBytes != source.DefaultMaxDownloadBytes || opts.MaxFiles != source.DefaultMaxFiles ||
		opts.MaxTotalBytes != source.DefaultMaxTotalBytes || len(opts.AllowHosts) != 0 || opts.RootCAs != nil {
		t.Errorf("got %+v, want the package's limits, no allowed hosts and the system's roots", opts)
	}
	if got := c.sandboxConfig().SourcePrefixes; len(got) != 0 {
		t.Errorf("got source prefixes %v, want none by default", got)
	}
}

func TestSourcesConfig(t *testing.T) {
	ca := caFile(t)
	c, err := load(t, `
sources:
  allow_hosts: ["127.0.0.1:8443", "mirror.internal"]
  ca_file: `+ca+`
  gcs_prefixes:
    "acme:evals": ["gs://acme-tasks/evals/", "gs://acme-shared"]
  max_download_bytes: 1000
  max_files: 10
  max_total_bytes: 2000
`)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.Sources.Options()
	if err != nil {
		t.Fatal(err)
	}
	if opts.MaxDownloadBytes != 1000 || opts.MaxFiles != 10 || opts.MaxTotalBytes != 2000 ||
		strings.Join(opts.AllowHosts, ",") != "127.0.0.1:8443,mirror.internal" || opts.RootCAs == nil {
		t.Fatalf("got %+v", opts)
	}
	// The pool trusts the CA file's certificate.
	data, _ := os.ReadFile(ca)
	block, _ := pem.Decode(data)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: opts.RootCAs, DNSName: "example.com"}); err != nil {
		t.Errorf("the CA file's certificate does not verify against the pool: %v", err)
	}
	if got := c.sandboxConfig().SourcePrefixes["acme:evals"]; len(got) != 2 {
		t.Errorf("got prefixes %v, want the two of acme:evals", got)
	}
}

func TestSourcesConfigRefused(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, yaml, want string }{
		{"scope-without-project", `sources: {gcs_prefixes: {"acme": ["gs://acme-tasks/x/"]}}`, `"acme" must be tenant:project`},
		{"scope-bad-id", `sources: {gcs_prefixes: {"acme:ev als": ["gs://acme-tasks/x/"]}}`, "must be tenant:project"},
		{"prefix-scheme", `sources: {gcs_prefixes: {"acme:evals": ["s3://acme-tasks/x/"]}}`, "gs://"},
		{"prefix-bucket", `sources: {gcs_prefixes: {"acme:evals": ["gs://A/x/"]}}`, "valid bucket"},
		{"prefix-dotdot", `sources: {gcs_prefixes: {"acme:evals": ["gs://acme-tasks/x/../y/"]}}`, `".."`},
		{"allow-host", `sources: {allow_hosts: ["https://mirror.internal/"]}`, "sources.allow_hosts"},
		{"ca-missing", `sources: {ca_file: /nonexistent/ca.pem}`, "sources.ca_file"},
		{"ca-not-pem", `sources: {ca_file: ` + notPEM + `}`, "no PEM certificate"},
		{"limit", `sources: {max_files: -1}`, "max_files"},
		{"unknown-key", `sources: {allow_host: ["x"]}`, "allow_host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.yaml+"\n")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// The GCS lister makes its client on first use, against STORAGE_EMULATOR_HOST when set.
func TestLazyGCS(t *testing.T) {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", Port: 0, PublicHost: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	srv.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "src-bucket", Name: "tasks/a.txt"}, Content: []byte("A")})
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("STORAGE_EMULATOR_HOST", u.Host)
	l := &lazyGCS{}
	defer l.Close()
	if l.lister != nil {
		t.Fatal("the client was made before first use")
	}
	ctx := context.Background()
	var names []string
	for o, err := range l.Objects(ctx, "src-bucket", "tasks/") {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, o.Name)
	}
	if len(names) != 1 || names[0] != "tasks/a.txt" {
		t.Fatalf("got %v, want [tasks/a.txt]", names)
	}
	rc, err := l.Open(ctx, "src-bucket", "tasks/a.txt", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "A" {
		t.Fatalf("got %q, want A", b)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Open(ctx, "src-bucket", "tasks/a.txt", 0); err == nil {
		t.Fatal("open after Close: got nil error")
	}
}

func TestAgentCatalogConfig(t *testing.T) {
	c, err := load(t, "{}\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Agents) != 1 || c.Agents[0].ID != "opencode" || c.Agents[0].Binary != "opencode" ||
		c.Agents[0].Integrations[0] != "sandbox" {
		t.Fatalf("default catalog: got %+v, want opencode attached to sandboxes", c.Agents)
	}
	c, err = load(t, "agents:\n  - {id: mine, integrations: [sandbox], binary: mine, command: [mine, \"{{instruction_file}}\"], timeout_sec: 60}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.sandboxConfig().Agents; len(got) != 1 || got[0].ID != "mine" || got[0].TimeoutSec != 60 || got[0].Command[1] != "{{instruction_file}}" {
		t.Fatalf("configured catalog: got %+v, want only mine", got)
	}
}

func TestRuntimeConfig(t *testing.T) {
	// The kube runtime needs no runsc, init binary or rootfs, but an init image and an image
	// for every profile; the default profile takes SANDBOXD_IMAGE.
	env := map[string]string{"SANDBOX_API_KEY": "a-long-dev-key", "SANDBOXD_RUNTIME": "kube",
		"SANDBOXD_INIT_IMAGE": "sandboxd/sandbox-init:1", "SANDBOXD_IMAGE": "sandboxd/base:1", "KUBECONFIG": "/k/config"}
	c, err := loadConfig(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != "kube" || c.Kube.InitImage != "sandboxd/sandbox-init:1" || c.Profiles[0].Image != "sandboxd/base:1" || c.Kube.Kubeconfig != "/k/config" {
		t.Errorf("got runtime %q, kube %+v, profile %+v", c.Runtime, c.Kube, c.Profiles[0])
	}
	env["SANDBOXD_KUBECONFIG"] = "/k/other"
	if c, _ = loadConfig(nil, func(k string) string { return env[k] }); c.Kube.Kubeconfig != "/k/other" {
		t.Errorf("SANDBOXD_KUBECONFIG: got %q, want it over KUBECONFIG", c.Kube.Kubeconfig)
	}
	delete(env, "SANDBOXD_INIT_IMAGE")
	delete(env, "SANDBOXD_IMAGE")
	_, err = loadConfig(nil, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "kube.init_image") || !strings.Contains(err.Error(), "has no image") {
		t.Errorf("kube without images: got %v, want both named", err)
	}
	// A profile whose image carries the guest init needs no init image; one without it does.
	withInit, err := load(t, "runtime: kube\nprofiles:\n  - {name: a, image: img:1, image_has_init: true}\n")
	if err != nil || withInit.Kube.InitImage != "" {
		t.Errorf("kube, every image with the init, no init image: %v", err)
	}
	_, err = load(t, "runtime: kube\nprofiles:\n  - {name: a, image: img:1, image_has_init: true}\n  - {name: b, image: img:2}\n")
	if err == nil || !strings.Contains(err.Error(), "profile b needs kube.init_image") || strings.Contains(err.Error(), "profile a needs") {
		t.Errorf("kube, one image without the init, no init image: got %v, want profile b named", err)
	}
	env["SANDBOXD_RUNTIME"] = "docker"
	if _, err = loadConfig(nil, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "runtime must be gvisor or kube") {
		t.Errorf("an unknown runtime: got %v", err)
	}
}

func TestEdgeConfig(t *testing.T) {
	c, err := load(t, "{}\n")
	if err != nil {
		t.Fatal(err)
	}
	g := c.graphqlOptions()
	if g.ComplexityLimit != 10000 || g.MaxReadBytes != 16<<20 || g.MaxMutationFields != 10 ||
		g.MaxOperationsPerConnection != 100 || g.DisableIntrospection || g.OutputFieldBytes != 1<<20 {
		t.Errorf("default GraphQL options: %+v", g)
	}
	if c.MaxStreamsPerProject != 250 || c.Execs.MaxRunningPerSandbox != 64 || !c.RateLimit.For(auth.Principal{Key: "x"}).Unlimited() {
		t.Errorf("defaults: streams %d, running %d, rate %+v", c.MaxStreamsPerProject, c.Execs.MaxRunningPerSandbox, c.RateLimit)
	}
	c, err = load(t, `
graphql: {introspection: false, complexity_limit: 50}
rate_limit: {requests_per_sec: 5, burst: 10, keys: {SANDBOX_API_KEY: {requests_per_sec: 1, burst: 1}}}
`)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.graphqlOptions(); !g.DisableIntrospection || g.ComplexityLimit != 50 {
		t.Errorf("options: %+v", g)
	}
	if l := c.RateLimit.For(auth.Principal{Key: "SANDBOX_API_KEY"}); l.RequestsPerSec != 1 {
		t.Errorf("key override: %+v", l)
	}

	for _, tt := range []struct{ name, yaml, want string }{
		{"streams-over-total", "max_subscriptions: 10\nmax_streams_per_project: 11", "max_streams_per_project"},
		{"running", "execs: {max_running_per_sandbox: 5000}", "max_running_per_sandbox"},
		{"rate-negative", "rate_limit: {requests_per_sec: -1}", "rate_limit"},
		{"rate-unknown-key", "rate_limit: {keys: {nobody: {requests_per_sec: 1, burst: 1}}}", "nobody"},
		{"read-bytes", "graphql: {max_read_bytes: -1}", "max_read_bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.yaml+"\n")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// valueOf reads the setting of c named like s (by flag, else environment variable).
func valueOf(t *testing.T, c *Config, s setting) string {
	t.Helper()
	for _, cs := range c.settings() {
		if cs.flag == s.flag && cs.env == s.env {
			return cs.String()
		}
	}
	t.Fatalf("no setting --%s/%s", s.flag, s.env)
	return ""
}

// fileWith is a config file (JSON, which is YAML) that sets the dotted key to v.
func fileWith(t *testing.T, key string, v any) string {
	t.Helper()
	parts := strings.Split(key, ".")
	var doc any = v
	for i := len(parts) - 1; i >= 0; i-- {
		doc = map[string]any{parts[i]: doc}
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every setting of the table: its config key sets the value it points to, and flags >
// environment > config file > defaults (an environment variable under the file only fills
// what the file leaves empty).
func TestSettingsPrecedence(t *testing.T) {
	var probe Config
	for _, s := range probe.settings() {
		if s.val == &probe.file {
			continue // TestConfigFileSetting
		}
		t.Run(s.flag+s.env, func(t *testing.T) {
			// Distinct values per layer, of the setting's type.
			vals := map[string]string{"file": "from-file", "under": "from-under", "env": "from-env", "flag": "from-flag"}
			var fileVal any = vals["file"]
			if _, ok := s.val.(*int); ok {
				vals = map[string]string{"file": "3", "under": "4", "env": "5", "flag": "6"}
				fileVal = 3
			}
			if _, ok := s.val.(*float64); ok {
				vals = map[string]string{"file": "0.3", "under": "0.4", "env": "0.5", "flag": "0.6"}
				fileVal = 0.3
			}
			type layers struct{ file, under, env, flag bool }
			load := func(l layers) string {
				t.Helper()
				env := map[string]string{}
				var args []string
				if l.file {
					args = append(args, "--config", fileWith(t, s.key, fileVal))
				}
				if l.under {
					env[s.envUnderFile] = vals["under"]
				}
				if l.env {
					env[s.env] = vals["env"]
				}
				if l.flag {
					args = append(args, "--"+s.flag, vals["flag"])
				}
				c, _ := loadConfig(args, func(k string) string { return env[k] }) // validity is not the point
				return valueOf(t, &c, s)
			}
			def := defaultConfig()
			want := valueOf(t, &def, s)
			if got := load(layers{}); got != want && s.key != "checkpoint_dir" {
				t.Errorf("default: got %q, want %q", got, want)
			}
			if s.key != "" {
				if got := load(layers{file: true}); got != vals["file"] {
					t.Errorf("config file key %s: got %q, want %q", s.key, got, vals["file"])
				}
			}
			if s.envUnderFile != "" {
				if got := load(layers{under: true}); got != vals["under"] {
					t.Errorf("%s: got %q, want %q", s.envUnderFile, got, vals["under"])
				}
				if got := load(layers{file: true, under: true}); got != vals["file"] {
					t.Errorf("%s under the config file: got %q, want the file's %q", s.envUnderFile, got, vals["file"])
				}
			}
			if s.env != "" {
				if got := load(layers{file: s.key != "", under: s.envUnderFile != "", env: true}); got != vals["env"] {
					t.Errorf("%s over the config file: got %q, want %q", s.env, got, vals["env"])
				}
			}
			if s.flag != "" {
				if got := load(layers{file: s.key != "", under: s.envUnderFile != "", env: s.env != "", flag: true}); got != vals["flag"] {
					t.Errorf("--%s over the environment: got %q, want %q", s.flag, got, vals["flag"])
				}
			}
		})
	}
}

// The config file comes from --config over SANDBOXD_CONFIG.
func TestConfigFileSetting(t *testing.T) {
	fromFlag, fromEnv := fileWith(t, "listen", "flag:1"), fileWith(t, "listen", "env:1")
	env := map[string]string{"SANDBOXD_CONFIG": fromEnv}
	for _, tt := range []struct {
		args []string
		want string
	}{{nil, "env:1"}, {[]string{"--config", fromFlag}, "flag:1"}} {
		c, _ := loadConfig(tt.args, func(k string) string { return env[k] })
		if c.Listen != tt.want {
			t.Errorf("args %v: got listen %q, want %q", tt.args, c.Listen, tt.want)
		}
	}
}

// -h lists every flag with its environment variables and default, then the settings only the
// environment sets.
func TestUsage(t *testing.T) {
	c := defaultConfig()
	fs := newFlagSet(c.settings())
	var out strings.Builder
	fs.SetOutput(&out)
	fs.Usage()
	help := out.String()
	for _, s := range c.settings() {
		if s.flag != "" && !strings.Contains(help, "-"+s.flag+" string\n") {
			t.Errorf("-h has no flag -%s:\n%s", s.flag, help)
		}
		for _, e := range s.envs() {
			if !strings.Contains(help, e) {
				t.Errorf("-h does not name %s:\n%s", e, help)
			}
		}
	}
	for _, want := range []string{`(default "127.0.0.1:8780")`, "SANDBOX_CONCURRENCY_LIMIT  each tenant:project's concurrency limit; 0 means unlimited (default 10)",
		"env SANDBOXD_KUBECONFIG or KUBECONFIG"} {
		if !strings.Contains(help, want) {
			t.Errorf("-h does not say %q:\n%s", want, help)
		}
	}
}

// readmeConfiguration returns the README's "## Configuration" section.
func readmeConfiguration(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(data), "\n## Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	return sec
}

// codeSpans returns the `code` spans of a Markdown table cell.
func codeSpans(cell string) []string {
	var spans []string
	for i, part := range strings.Split(cell, "`") {
		if i%2 == 1 {
			spans = append(spans, part)
		}
	}
	return spans
}

// The README's table of settings and the table in config.go say the same: every row is a
// setting with that flag, those environment variables (strongest first), that config key and
// its default; every setting has a row.
func TestReadmeSettings(t *testing.T) {
	var rows [][]string
	for _, line := range strings.Split(readmeConfiguration(t), "\n") {
		if strings.HasPrefix(line, "|") {
			cells := strings.Split(strings.Trim(line, "| "), " | ")
			rows = append(rows, cells)
		} else if len(rows) > 0 {
			break // the first table only
		}
	}
	if len(rows) < 3 {
		t.Fatalf("no table of settings in the README's Configuration section")
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[strings.TrimSpace(h)] = i
	}
	for _, h := range []string{"setting", "flag", "environment", "config file", "default"} {
		if _, ok := col[h]; !ok {
			t.Fatalf("the README's table has no column %q: %v", h, rows[0])
		}
	}
	one := func(cell string) string { // the cell's one code span, or "" for none
		spans := codeSpans(cell)
		if len(spans) > 1 {
			t.Errorf("cell %q: want at most one code span", cell)
		}
		return strings.Join(spans, "")
	}
	c := defaultConfig()
	home, _ := os.UserHomeDir()
	seen := map[string]bool{}
	for _, row := range rows[2:] {
		if len(row) != len(rows[0]) {
			t.Errorf("row %q: %d cells, want %d", row, len(row), len(rows[0]))
			continue
		}
		flagName := strings.TrimPrefix(one(row[col["flag"]]), "--")
		envs := codeSpans(row[col["environment"]])
		var s *setting
		for _, cs := range c.settings() {
			if (flagName != "" && cs.flag == flagName) || (flagName == "" && cs.flag == "" && len(envs) > 0 && cs.env == envs[0]) {
				s = &cs
				break
			}
		}
		if s == nil {
			t.Errorf("README row %q: no setting has flag %q / environment %q", row[col["setting"]], flagName, envs)
			continue
		}
		name := s.flag + s.env
		seen[name] = true
		if !slices.Equal(envs, s.envs()) {
			t.Errorf("README row %q: environment %q, want %q", row[col["setting"]], envs, s.envs())
		}
		if key := one(row[col["config file"]]); key != s.key {
			t.Errorf("README row %q: config file key %q, want %q", row[col["setting"]], key, s.key)
		}
		if def := s.String(); def != "" && s.key != "" {
			if home != "" {
				def = strings.Replace(def, home, "~", 1)
			}
			if !slices.Contains(codeSpans(row[col["default"]]), def) {
				t.Errorf("README row %q: the default column does not say `%s`", row[col["setting"]], def)
			}
		}
	}
	for _, s := range c.settings() {
		if !seen[s.flag+s.env] {
			t.Errorf("the README's table has no row for %s", s.hint())
		}
	}
}

// The README's example config file names only keys that exist.
func TestReadmeExampleConfig(t *testing.T) {
	_, example, ok := strings.Cut(readmeConfiguration(t), "```yaml\n")
	if !ok {
		t.Fatal("the README's Configuration section has no ```yaml example")
	}
	example, _, _ = strings.Cut(example, "```")
	c := defaultConfig()
	if err := yaml.UnmarshalStrict([]byte(example), &c); err != nil {
		t.Fatalf("the README's example config: %v", err)
	}
	if c.Checkpoints.Store != "gcs" || len(c.APIKeys) == 0 || len(c.Agents) == 0 {
		t.Errorf("the example did not load: %+v", c)
	}
}

// The embedded Redis refuses writes when full: a maxmemory that ended execs' output alone
// could fill (their sweep keeps up to execs.max_ended_bytes) is a config error; with a
// REDIS_URL the section does not apply.
func TestRedisMaxMemoryLeavesRoomForRunningExecs(t *testing.T) {
	if _, err := load(t, "redis: {maxmemory: 64mb}\n"); err == nil || !strings.Contains(err.Error(), "at least twice execs.max_ended_bytes") {
		t.Fatalf("maxmemory equal to the default max_ended_bytes: got %v, want the room error", err)
	}
	if _, err := load(t, "redis: {maxmemory: 256mb}\nexecs: {max_ended_bytes: 134217728}\n"); err != nil {
		t.Fatalf("maxmemory twice max_ended_bytes: %v", err)
	}
	if _, err := load(t, "redis: {maxmemory: 16mb}\nexecs: {max_ended_bytes: 16777216}\nredis_url: redis://127.0.0.1:1\n"); err != nil {
		t.Fatalf("with a REDIS_URL the embedded Redis's bound does not apply: %v", err)
	}
}
