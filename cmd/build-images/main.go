// Command build-images builds every image deploy/ runs, without Docker, as OCI image layouts,
// and pushes them when asked (go-containerregistry):
//
//	sandboxd/sandboxd        the gateway: the static sandboxd from scratch, run as 65532
//	sandboxd/sandbox-init    the static guest init at /sandbox-init (runtime/kube's init image),
//	                         the spawner program (guest/spawner) at /sandbox-spawn and the
//	                         connect program (guest/connect) at /sandbox-connect
//	sandboxd/sandbox-default the default sandbox base: the debootstrap rootfs the local runtime
//	                         uses (scripts/ensure-rootfs.sh), the guest init baked in at /.sbx/init,
//	                         the spawner program at /.sbx/spawn and the connect program at
//	                         /.sbx/connect
//
//	build-images --out DIR --rootfs ROOTFS [--push REGISTRY] [--tag TAG] [--revision REV]
//	             [--source URL] [--epoch UNIX] [--cache DIR] [--ca-certificates FILE]
//
// Each image is a layout DIR/<name> whose index.json names it by its reference
// (org.opencontainers.image.ref.name, e.g. sandboxd/sandboxd:0.1.0); DIR/images.json lists
// references, digests and sizes. Builds are reproducible: every time in the images is the epoch
// (--epoch, else SOURCE_DATE_EPOCH, else the commit's time), tar entries are sorted, owners
// numeric, the Go binaries built with -trimpath, -buildvcs=false and no build id, the C programs
// by scripts/build-guest-c.sh (static, no debug information), gzip without names or times; the
// same inputs give the same digests. Run it from the repository's root (scripts/build-images.sh
// does, and wraps it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"sandboxd/internal/version"
)

type options struct {
	out, rootfs, push, tag, revision, source, cache, caBundle string
	epoch                                                     string
}

func main() {
	var o options
	fs := flag.NewFlagSet("build-images", flag.ExitOnError)
	fs.StringVar(&o.out, "out", "", "output folder: one OCI image layout per image, and images.json")
	fs.StringVar(&o.rootfs, "rootfs", "", "the debootstrap rootfs of the default sandbox base (scripts/ensure-rootfs.sh sandboxes-default)")
	fs.StringVar(&o.push, "push", "", "also push every image to this registry (REGISTRY/sandboxd:TAG, …); credentials from the docker config")
	fs.StringVar(&o.tag, "tag", version.Version, "the images' tag (default: the version in internal/version/VERSION)")
	fs.StringVar(&o.revision, "revision", "", "source revision in the binaries and labels (default: git HEAD, -dirty when the tree has changes)")
	fs.StringVar(&o.source, "source", "", "org.opencontainers.image.source (default: the origin remote's URL when it is one, else \"unknown\")")
	fs.StringVar(&o.epoch, "epoch", "", "every timestamp in the images, in Unix seconds (default: SOURCE_DATE_EPOCH, else HEAD's commit time)")
	fs.StringVar(&o.cache, "cache", "", "where compressed layers are kept between builds (default $SANDBOXD_CACHE/images, ~/.cache/sandboxd/images)")
	fs.StringVar(&o.caBundle, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "CA bundle put into the gateway image (GCS, HTTPS archives)")
	fs.Parse(os.Args[1:])
	if o.out == "" || o.rootfs == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: build-images --out DIR --rootfs ROOTFS [--push REGISTRY] [flags]; -h for the flags")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "build-images:", err)
		os.Exit(1)
	}
}

// built is one image of a build, as images.json lists it.
type built struct {
	Name              string `json:"name"`
	Reference         string `json:"reference"`
	Layout            string `json:"layout"`
	Digest            string `json:"digest"`
	CompressedBytes   int64  `json:"compressed_bytes"`
	UncompressedBytes int64  `json:"uncompressed_bytes"`
	Pushed            string `json:"pushed,omitempty"`
	img               v1.Image
}

func run(ctx context.Context, o options) error {
	m, err := o.meta()
	if err != nil {
		return err
	}
	if o.cache == "" {
		o.cache = filepath.Join(cacheRoot(), "images")
	}
	cache := layerCache{dir: filepath.Join(o.cache, "layers")}
	if fi, err := os.Stat(filepath.Join(o.rootfs, "usr", "bin")); err != nil || !fi.IsDir() {
		return fmt.Errorf("--rootfs %s is not a root file system (no usr/bin)", o.rootfs)
	}
	bin, err := os.MkdirTemp("", "build-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	sandboxd, initBin := filepath.Join(bin, "sandboxd"), filepath.Join(bin, "sandbox-init")
	for _, b := range []struct{ pkg, out string }{{"./cmd/sandboxd", sandboxd}, {"./cmd/sandbox-init", initBin}} {
		if err := goBuild(ctx, b.pkg, b.out, m.revision); err != nil {
			return err
		}
	}
	spawner, connect := filepath.Join(bin, "sandbox-spawn"), filepath.Join(bin, "sandbox-connect")
	for _, c := range []struct{ name, out string }{{"spawner", spawner}, {"connect", connect}} {
		if b, err := exec.CommandContext(ctx, "scripts/build-guest-c.sh", c.name, c.out).CombinedOutput(); err != nil {
			return fmt.Errorf("building the %s program: %v\n%s", c.name, err, b)
		}
	}

	var images []*built
	add := func(repo string, cfg v1.Config, what []string, writes ...func(*layerWriter) error) error {
		layers := make([]v1.Layer, len(writes))
		for i, w := range writes {
			l, err := cache.layer(w, m.epoch)
			if err != nil {
				return fmt.Errorf("%s: layer %q: %w", repo, what[i], err)
			}
			layers[i] = l
		}
		img, err := m.image(cfg, layers, what)
		if err != nil {
			return fmt.Errorf("%s: %w", repo, err)
		}
		images = append(images, &built{Name: path.Base(repo), Reference: repo + ":" + o.tag, Layout: path.Base(repo), img: img})
		return nil
	}
	files := func(fs []file) func(*layerWriter) error {
		return func(w *layerWriter) error { return w.writeFiles(fs) }
	}
	if err := add(repoSandboxd, m.sandboxdConfig(), []string{"sandboxd, CA certificates, passwd"},
		files(sandboxdFiles(sandboxd, o.caBundle))); err != nil {
		return err
	}
	if err := add(repoInit, m.initConfig(), []string{"sandbox-init, sandbox-spawn, sandbox-connect"},
		files([]file{
			{name: strings.TrimPrefix(initImagePath, "/"), mode: 0o755, src: initBin},
			{name: strings.TrimPrefix(initSpawnerPath, "/"), mode: 0o755, src: spawner},
			{name: strings.TrimPrefix(initConnectPath, "/"), mode: 0o755, src: connect},
		})); err != nil {
		return err
	}
	if err := add(repoBase, m.baseConfig(), []string{"debootstrap rootfs (sandboxes-default)", "guest init at " + baseInitPath + ", spawner at " + baseSpawnerPath + ", connect at " + baseConnectPath},
		func(w *layerWriter) error { return w.writeRootfs(o.rootfs) },
		files([]file{
			{name: ".sbx", mode: 0o755, dir: true},
			{name: strings.TrimPrefix(baseInitPath, "/"), mode: 0o755, src: initBin},
			{name: strings.TrimPrefix(baseSpawnerPath, "/"), mode: 0o755, src: spawner},
			{name: strings.TrimPrefix(baseConnectPath, "/"), mode: 0o755, src: connect},
		})); err != nil {
		return err
	}

	// The layers of the last two builds (four each) stay cached: the base's rootfs layer
	// changes with the epoch, so every commit brings a new one (85 MB).
	if err := cache.prune(8); err != nil {
		return fmt.Errorf("pruning the layer cache: %w", err)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for _, b := range images {
		if err := b.describe(); err != nil {
			return err
		}
		if err := writeLayout(filepath.Join(o.out, b.Layout), b.img, b.Reference); err != nil {
			return fmt.Errorf("%s: %w", b.Reference, err)
		}
	}
	if o.push != "" {
		for _, b := range images {
			if err := b.pushTo(ctx, o.push, o.tag); err != nil {
				return err
			}
		}
	}
	list, err := json.MarshalIndent(images, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "images.json"), append(list, '\n'), 0o644); err != nil {
		return err
	}
	for _, b := range images {
		fmt.Printf("%-36s %s  %6.1f MB compressed, %6.1f MB unpacked%s\n", b.Reference, b.Digest,
			float64(b.CompressedBytes)/1e6, float64(b.UncompressedBytes)/1e6, pushedNote(b.Pushed))
	}
	return nil
}

func pushedNote(ref string) string {
	if ref == "" {
		return ""
	}
	return "\n  pushed " + ref
}

// describe fills in b's digest and sizes.
func (b *built) describe() error {
	d, err := b.img.Digest()
	if err != nil {
		return err
	}
	b.Digest = d.String()
	layers, err := b.img.Layers()
	if err != nil {
		return err
	}
	b.CompressedBytes, b.UncompressedBytes = 0, 0
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return err
		}
		b.CompressedBytes += n
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		u, err := countBytes(rc)
		if err != nil {
			return err
		}
		b.UncompressedBytes += u
	}
	return nil
}

// pushTo pushes b as REGISTRY/<name>:tag and checks that the registry has the same digest.
func (b *built) pushTo(ctx context.Context, registry, tag string) error {
	ref, err := name.ParseReference(strings.TrimSuffix(registry, "/") + "/" + b.Name + ":" + tag)
	if err != nil {
		return fmt.Errorf("--push %s: %w", registry, err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if err := remote.Write(ref, b.img, opts...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	desc, err := remote.Head(ref, opts...)
	if err != nil {
		return fmt.Errorf("push %s: reading it back: %w", ref, err)
	}
	if desc.Digest.String() != b.Digest {
		return fmt.Errorf("push %s: the registry has %s, want %s", ref, desc.Digest, b.Digest)
	}
	b.Pushed = ref.Context().Digest(b.Digest).String()
	return nil
}

// writeLayout writes img as the OCI image layout dir, its index naming it ref. The layout is
// made beside dir and then put in its place, so dir never holds two builds' blobs.
func writeLayout(dir string, img v1.Image, ref string) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refName: ref})); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// meta resolves the build's version, revision, source and epoch.
func (o options) meta() (meta, error) {
	m := meta{version: version.Version, revision: o.revision, source: o.source}
	if m.revision == "" {
		rev, err := git("rev-parse", "HEAD")
		if err != nil {
			return m, fmt.Errorf("no --revision and no git revision: %w", err)
		}
		if status, err := git("status", "--porcelain", "--untracked-files=no"); err == nil && status != "" {
			rev += "-dirty"
		}
		m.revision = rev
	}
	if m.source == "" {
		m.source = "unknown"
		// A URL only: a clone of a local folder names a path, which says nothing to a reader
		// of the image and differs between machines.
		if url, err := git("remote", "get-url", "origin"); err == nil && (strings.Contains(url, "://") && !strings.HasPrefix(url, "file://") || strings.HasPrefix(url, "git@")) {
			m.source = url
		}
	}
	epoch := o.epoch
	if epoch == "" {
		epoch = os.Getenv("SOURCE_DATE_EPOCH")
	}
	if epoch == "" {
		var err error
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return m, fmt.Errorf("no --epoch, no SOURCE_DATE_EPOCH and no commit time: %w", err)
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || sec < 0 {
		return m, fmt.Errorf("epoch %q: want Unix seconds", epoch)
	}
	m.epoch = time.Unix(sec, 0).UTC()
	return m, nil
}

// goBuild builds pkg as a static binary that is the same for the same source anywhere.
func goBuild(ctx context.Context, pkg, out, revision string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X sandboxd/internal/version.revision="+revision, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
	}
	return strings.TrimSpace(string(out)), err
}

// cacheRoot is SANDBOXD_CACHE, else ~/.cache/sandboxd (scripts/lib.sh's rule).
func cacheRoot() string {
	if d := os.Getenv("SANDBOXD_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "sandboxd-cache")
	}
	return filepath.Join(home, ".cache", "sandboxd")
}
