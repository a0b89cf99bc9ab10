package main

import (
	"fmt"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Repositories of the project's images: what deploy/ names, and the last element is the
// repository under a registry given to --push.
const (
	repoSandboxd = "sandboxd/sandboxd"
	repoInit     = "sandboxd/sandbox-init"
	repoBase     = "sandboxd/sandbox-default"
)

// nonroot is the gateway's user and group: not root, and no user any base image has.
const nonroot = 65532

// Paths in the images that runtime/kube and deploy/ rely on.
const (
	sandboxdPath  = "/sandboxd"
	initImagePath = "/sandbox-init" // the init image's binary (runtime/kube's init container runs it)
	baseInitPath  = "/.sbx/init"    // the guest init baked into the base image
	// The spawner program (guest/spawner) beside each: `sandbox-init install` copies the
	// init image's one beside the init it installs, as spawn.
	initSpawnerPath = "/sandbox-spawn"
	baseSpawnerPath = "/.sbx/spawn"
	// The connect program (guest/connect), runtime/kube's attach, the same way: installed
	// beside the init as connect.
	initConnectPath = "/sandbox-connect"
	baseConnectPath = "/.sbx/connect"
	caBundlePath    = "etc/ssl/certs/ca-certificates.crt"
)

// Labels every image carries.
const (
	labelSource   = "org.opencontainers.image.source"
	labelRevision = "org.opencontainers.image.revision"
	labelVersion  = "org.opencontainers.image.version"
	labelTitle    = "org.opencontainers.image.title"
	labelCreated  = "org.opencontainers.image.created"
	// labelGuestInit names where an image holds the guest init, so a runtime can see that the
	// image carries its own.
	labelGuestInit = "io.sandboxd.guest-init"
	// refName is the annotation of an OCI layout's index that names an image.
	refName = "org.opencontainers.image.ref.name"
)

// meta is what every image of one build shares.
type meta struct {
	version, revision, source string
	epoch                     time.Time
}

func (m meta) labels(title string) map[string]string {
	return map[string]string{
		labelSource: m.source, labelRevision: m.revision, labelVersion: m.version, labelTitle: title,
		labelCreated: m.epoch.UTC().Format(time.RFC3339),
	}
}

// image assembles an OCI image (OCI media types, this machine's platform) of layers, each with
// a history entry saying what it holds, and cfg; every time in it is the epoch.
func (m meta) image(cfg v1.Config, layers []v1.Layer, what []string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: m.epoch}, CreatedBy: "build-images: " + what[i]}}
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = runtime.GOARCH, "linux"
	cf.Created = v1.Time{Time: m.epoch}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// passwd and group of the gateway's image: root, and nonroot (65532) whom it runs as.
var (
	passwd = fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)
	group  = fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot)
)

// sandboxdFiles are the gateway image's one layer: the static sandboxd, CA certificates (GCS,
// HTTPS archives), passwd and group, a home for nonroot and /tmp.
func sandboxdFiles(bin, caBundle string) []file {
	return []file{
		{name: "sandboxd", mode: 0o755, src: bin},
		{name: "etc", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/ssl", mode: 0o755, dir: true},
		{name: "etc/ssl/certs", mode: 0o755, dir: true},
		{name: caBundlePath, mode: 0o644, src: caBundle},
		{name: "home", mode: 0o755, dir: true},
		{name: "home/nonroot", mode: 0o700, uid: nonroot, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
	}
}

// sandboxdConfig runs sandboxd as nonroot; the Deployment sets its config and listen address.
func (m meta) sandboxdConfig() v1.Config {
	return v1.Config{
		User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
		Entrypoint:   []string{sandboxdPath},
		WorkingDir:   "/",
		Env:          []string{"PATH=/", "HOME=/home/nonroot", "SSL_CERT_FILE=/" + caBundlePath},
		ExposedPorts: map[string]struct{}{"8780/tcp": {}},
		Labels:       m.labels("sandboxd"),
	}
}

// initConfig: the init image is run by runtime/kube's init container ("/sandbox-init install").
func (m meta) initConfig() v1.Config {
	l := m.labels("sandbox-init")
	l[labelGuestInit] = initImagePath
	return v1.Config{Entrypoint: []string{initImagePath}, WorkingDir: "/", Labels: l}
}

// baseConfig: the default sandbox base runs its own guest init as PID 1 over /workspace.
func (m meta) baseConfig() v1.Config {
	l := m.labels("sandbox-default")
	l[labelGuestInit] = baseInitPath
	return v1.Config{
		Entrypoint: []string{baseInitPath, "serve"},
		WorkingDir: "/workspace",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels:     l,
	}
}
