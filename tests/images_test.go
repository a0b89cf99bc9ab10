package tests

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"sandboxd/internal/version"
	"sandboxd/tests/e2e"
)

// imageRefs are the references scripts/build-images.sh names its layouts by: what deploy/ and
// the kube tests run.
var imageRefs = map[string]string{
	"sandboxd":        "sandboxd/sandboxd:" + version.Version,
	"sandbox-init":    "sandboxd/sandbox-init:" + version.Version,
	"sandbox-default": "sandboxd/sandbox-default:" + version.Version,
}

// buildImages runs scripts/build-images.sh OUT with args, with its own empty layer cache, so
// that every layer is compressed again.
func buildImages(t *testing.T, out string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2e.ModuleRoot(), "scripts", "build-images.sh"),
		append([]string{out, "--cache", t.TempDir()}, args...)...)
	cmd.Dir = e2e.ModuleRoot()
	cmd.Env = append(os.Environ(), "SANDBOXD_ROOTFS="+e2e.Rootfs())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("build-images.sh %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr.String())
	}
	t.Logf("build-images.sh %s:\n%s", strings.Join(args, " "), stdout)
}

// layoutImage reads the one image of the layout dir and the reference its index names it by.
func layoutImage(t *testing.T, dir string) (v1.Image, string, v1.Hash) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("%s: got %d manifests in index.json, want 1", dir, len(m.Manifests))
	}
	d := m.Manifests[0]
	img, err := p.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, d.Annotations["org.opencontainers.image.ref.name"], d.Digest
}

// flatFiles reads the image's file system (layers flattened): each entry's header and content.
func flatFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		hdrs[n] = h
		if h.Typeflag == tar.TypeReg {
			if data[n], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return hdrs, data
}

// resolve follows symlinks inside the image (relative and absolute) to a regular file.
func resolve(hdrs map[string]*tar.Header, p string) (string, bool) {
	for range 10 {
		h, ok := hdrs[p]
		if !ok {
			// a link in a parent folder: usr/bin via bin -> usr/bin
			dir, base := path.Split(p)
			if dir == "" {
				return "", false
			}
			rd, ok := resolve(hdrs, strings.TrimSuffix(dir, "/"))
			if !ok {
				return "", false
			}
			p = path.Join(rd, base)
			continue
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			if strings.HasPrefix(h.Linkname, "/") {
				p = strings.TrimPrefix(path.Clean(h.Linkname), "/")
			} else {
				p = path.Join(path.Dir(p), h.Linkname)
			}
		case tar.TypeLink:
			p = strings.TrimPrefix(h.Linkname, "./")
		default:
			return p, true
		}
	}
	return "", false
}

// TestBuildImages runs scripts/build-images.sh the way a user does: twice (the same digests,
// each layer compressed anew), the second time pushing to a registry on loopback, whose images
// are pulled back and compared. It checks the images: references in index.json, OCI labels,
// the gateway runs as non-root and its entrypoint answers --version with the build's revision,
// the init binary is static, the base has bash and python3 and the guest init at /.sbx/init.
func TestBuildImages(t *testing.T) {
	e2e.RequireComponents(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	regHost := strings.TrimPrefix(reg.URL, "http://")

	out1, out2 := t.TempDir(), t.TempDir()
	// The label a user sets with --source (a checkout without an origin remote gets "unknown").
	const source = "https://source.example/sandboxd"
	buildImages(t, out1, "--source", source)
	buildImages(t, out2, "--source", source, "--push", regHost)

	type listed struct {
		Name, Reference, Layout, Digest, Pushed string
		CompressedBytes                         int64 `json:"compressed_bytes"`
		UncompressedBytes                       int64 `json:"uncompressed_bytes"`
	}
	var list []listed
	b, err := os.ReadFile(filepath.Join(out2, "images.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != len(imageRefs) {
		t.Fatalf("images.json: got %d images, want %d: %s", len(list), len(imageRefs), b)
	}
	imgs := map[string]v1.Image{}
	for _, l := range list {
		t.Run("layout-"+l.Name, func(t *testing.T) {
			img1, ref1, d1 := layoutImage(t, filepath.Join(out1, l.Layout))
			img, ref, d2 := layoutImage(t, filepath.Join(out2, l.Layout))
			imgs[l.Name] = img
			if ref != imageRefs[l.Name] || ref1 != ref || l.Reference != ref {
				t.Errorf("reference: got %q and %q (images.json %q), want %q", ref1, ref, l.Reference, imageRefs[l.Name])
			}
			if d1 != d2 || l.Digest != d2.String() {
				t.Errorf("digest: got %s then %s (images.json %s), want one digest from two builds", d1, d2, l.Digest)
			}
			l1, _ := img1.Layers()
			l2, _ := img.Layers()
			for i := range min(len(l1), len(l2)) {
				a, _ := l1[i].Digest()
				b, _ := l2[i].Digest()
				if a != b {
					t.Errorf("layer %d: got %s then %s", i, a, b)
				}
			}
			t.Logf("%s %s: %.1f MB compressed, %.1f MB unpacked", ref, d2, float64(l.CompressedBytes)/1e6, float64(l.UncompressedBytes)/1e6)

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.revision", "org.opencontainers.image.version"} {
				if cf.Config.Labels[k] == "" {
					t.Errorf("label %s: got none, want it set", k)
				}
			}
			if v := cf.Config.Labels["org.opencontainers.image.version"]; v != version.Version {
				t.Errorf("version label: got %q, want %q", v, version.Version)
			}
			if v := cf.Config.Labels["org.opencontainers.image.source"]; v != source {
				t.Errorf("source label: got %q, want the --source given, %q", v, source)
			}

			// Pulled back from the registry: the same digest, and the same layers.
			pref, err := name.ParseReference(regHost + "/" + l.Name + ":" + version.Version)
			if err != nil {
				t.Fatal(err)
			}
			pulled, err := remote.Image(pref)
			if err != nil {
				t.Fatalf("pull %s: %v", pref, err)
			}
			pd, _ := pulled.Digest()
			if pd != d2 || l.Pushed != pref.Context().Digest(d2.String()).String() {
				t.Errorf("pushed %s: got digest %s (images.json %q), want %s", pref, pd, l.Pushed, d2)
			}
			pl, err := pulled.Layers()
			if err != nil || len(pl) != len(l2) {
				t.Fatalf("pulled layers: got %d, %v; want %d", len(pl), err, len(l2))
			}
			for i := range pl {
				a, _ := pl[i].Digest()
				b, _ := l2[i].Digest()
				if a != b {
					t.Errorf("pulled layer %d: got %s, want %s", i, a, b)
				}
			}
		})
	}

	bin := t.TempDir()
	t.Run("sandboxd", func(t *testing.T) {
		img := imgs["sandboxd"]
		if img == nil {
			t.Fatal("no sandboxd image")
		}
		cf, _ := img.ConfigFile()
		if cf.Config.User != "65532:65532" {
			t.Errorf("user: got %q, want 65532:65532 (not root)", cf.Config.User)
		}
		if len(cf.Config.Entrypoint) != 1 {
			t.Fatalf("entrypoint: got %q, want one binary", cf.Config.Entrypoint)
		}
		hdrs, data := flatFiles(t, img)
		entry := strings.TrimPrefix(cf.Config.Entrypoint[0], "/")
		if h := hdrs[entry]; h == nil || h.Mode&0o111 == 0 {
			t.Fatalf("entrypoint %s: got %+v, want an executable file", entry, h)
		}
		p := filepath.Join(bin, "sandboxd")
		if err := os.WriteFile(p, data[entry], 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(p, "--version").Output()
		want := fmt.Sprintf("sandboxd %s (revision %s, ", version.Version, cf.Config.Labels["org.opencontainers.image.revision"])
		if err != nil || !strings.HasPrefix(string(got), want) {
			t.Errorf("%s --version: got %q, %v; want %q…", entry, got, err, want)
		}
		checkStatic(t, p)
		if len(data["etc/ssl/certs/ca-certificates.crt"]) == 0 {
			t.Errorf("no CA certificates in the gateway image (GCS and HTTPS archives need them)")
		}
	})
	t.Run("sandbox-init", func(t *testing.T) {
		img := imgs["sandbox-init"]
		if img == nil {
			t.Fatal("no sandbox-init image")
		}
		_, data := flatFiles(t, img)
		p := filepath.Join(bin, "sandbox-init")
		if err := os.WriteFile(p, data["sandbox-init"], 0o755); err != nil {
			t.Fatal(err)
		}
		checkStatic(t, p)
		if got, err := exec.Command(p, "--version").Output(); err != nil || !strings.HasPrefix(string(got), "sandbox-init "+version.Version+" (") {
			t.Errorf("sandbox-init --version: got %q, %v", got, err)
		}
	})
	t.Run("sandbox-default", func(t *testing.T) {
		img := imgs["sandbox-default"]
		if img == nil {
			t.Fatal("no sandbox-default image")
		}
		hdrs, data := flatFiles(t, img)
		for _, prog := range []string{"usr/bin/bash", "bin/bash", "usr/bin/python3", "usr/bin/env"} {
			p, ok := resolve(hdrs, prog)
			if !ok || hdrs[p].Mode&0o111 == 0 || !bytes.HasPrefix(data[p], []byte("\x7fELF")) {
				t.Errorf("%s: got %q (found %v), want an executable ELF file", prog, p, ok)
			}
		}
		_, initData := flatFiles(t, imgs["sandbox-init"])
		if h := hdrs[".sbx/init"]; h == nil || h.Mode != 0o755 || !bytes.Equal(data[".sbx/init"], initData["sandbox-init"]) {
			t.Errorf(".sbx/init: got %+v, want the init image's sandbox-init, mode 0755", h)
		}
		for n, h := range hdrs {
			if strings.HasPrefix(n, "dev/") && h.Typeflag != tar.TypeDir {
				t.Errorf("%s: got a %c entry under dev/, want none (the runtime mounts /dev)", n, h.Typeflag)
			}
			if n == ".sbx-complete" {
				t.Errorf("the rootfs's completion marker is in the image")
			}
		}
		cf, _ := img.ConfigFile()
		if got := cf.Config.Labels["io.sandboxd.guest-init"]; got != "/.sbx/init" {
			t.Errorf("label io.sandboxd.guest-init: got %q, want /.sbx/init", got)
		}
	})
}

// checkStatic fails t unless the ELF file p is statically linked: no interpreter, no
// dynamic section, no needed libraries.
func checkStatic(t *testing.T, p string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: program header %v, want a static binary", filepath.Base(p), prog.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("%s: needs %v, want no shared library", filepath.Base(p), libs)
	}
}
