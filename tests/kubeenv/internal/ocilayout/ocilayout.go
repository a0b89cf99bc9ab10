// Package ocilayout unpacks the images of OCI image layouts (what scripts/build-images.sh
// writes) into root file system folders, as a node's runtime would pull and unpack them, so
// that the test node runs the very images deploy/ ships. Standard library only: the index and
// manifests are JSON, the layers tar (gzip or plain), whiteouts as the OCI image spec defines.
// Every blob is checked against its digest, and entries are written through an os.Root, so a
// layer cannot write outside its folder (no "..", no absolute names, no writing through a link).
package ocilayout

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// RefName is the index annotation that names an image of a layout.
const RefName = "org.opencontainers.image.ref.name"

// Media types this package reads.
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type index struct {
	Manifests []descriptor `json:"manifests"`
}

type manifest struct {
	MediaType string       `json:"mediaType"`
	Layers    []descriptor `json:"layers"`
}

// Unpack unpacks every named image of the layout folder layoutDir into a folder of its own
// under into (named by the manifest's digest) and returns the image references with their
// folders. A folder already complete from an earlier call is used as it is; callers do not
// unpack into one folder at once.
func Unpack(layoutDir, into string) (map[string]string, error) {
	var idx index
	if err := readJSON(filepath.Join(layoutDir, "index.json"), &idx); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range idx.Manifests {
		ref := d.Annotations[RefName]
		if ref == "" {
			continue
		}
		if d.MediaType != mediaManifest {
			return nil, fmt.Errorf("%s: %s is a %s, want an image manifest", layoutDir, ref, d.MediaType)
		}
		var m manifest
		b, err := readBlob(layoutDir, d)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: manifest: %w", ref, err)
		}
		dir := filepath.Join(into, strings.TrimPrefix(d.Digest, "sha256:"))
		if _, err := os.Stat(dir + ".complete"); err != nil {
			if err := unpackImage(layoutDir, m, dir); err != nil {
				return nil, fmt.Errorf("%s: %w", ref, err)
			}
		}
		out[ref] = dir
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: index.json names no image (%s)", layoutDir, RefName)
	}
	return out, nil
}

// unpackImage applies m's layers in order to a new folder, then puts it at dir.
func unpackImage(layoutDir string, m manifest, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".unpack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return err
	}
	defer root.Close()
	for i, l := range m.Layers {
		if err := applyLayer(layoutDir, l, root); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, l.Digest, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil { // an unpack cut short before its marker
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	// The marker lies beside the folder, outside the image: a layer cannot fake it, and the
	// container does not see it.
	return os.WriteFile(dir+".complete", nil, 0o644)
}

// applyLayer extracts one layer blob into root, checking its digest as it is read.
func applyLayer(layoutDir string, l descriptor, root *os.Root) error {
	f, sum, err := openBlob(layoutDir, l)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	var r io.Reader = io.TeeReader(f, h)
	switch l.MediaType {
	case mediaLayerGz:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	case mediaLayer:
	default:
		return fmt.Errorf("media type %s is not supported", l.MediaType)
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := applyEntry(root, hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	if _, err := io.Copy(io.Discard, r); err != nil { // the rest of the blob, for its digest
		return err
	}
	return checkSum(h, sum)
}

// applyEntry writes one tar entry into root.
func applyEntry(root *os.Root, hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil || name == "" {
		return err
	}
	dir, base := path.Split(name)
	if dir != "" {
		if err := root.MkdirAll(strings.TrimSuffix(dir, "/"), 0o755); err != nil {
			return err
		}
	}
	if base == ".wh..wh..opq" { // opaque: the folder's lower contents go
		return clearDir(root, strings.TrimSuffix(dir, "/"))
	}
	if strings.HasPrefix(base, ".wh.") { // whiteout: the name goes
		return root.RemoveAll(dir + strings.TrimPrefix(base, ".wh."))
	}
	mode := fs.FileMode(hdr.Mode).Perm()
	if hdr.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if hdr.Typeflag != tar.TypeDir {
		if err := root.RemoveAll(name); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
			if err := root.Remove(name); err != nil {
				return err
			}
		}
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		return lown(root.Symlink(hdr.Linkname, name), root, name, hdr)
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, errors.Join(err, errors.New("not a name in the image")))
		}
		return root.Link(target, name)
	default:
		return fmt.Errorf("entry type %q is not supported", hdr.Typeflag)
	}
	if err := lown(nil, root, name, hdr); err != nil {
		return err
	}
	return root.Chmod(name, mode) // after the owner: chown clears setuid
}

// lown gives name the entry's numeric owner when err is nil (as root; otherwise the unpacking
// user keeps it).
func lown(err error, root *os.Root, name string, hdr *tar.Header) error {
	if err != nil || os.Geteuid() != 0 {
		return err
	}
	return root.Lchown(name, hdr.Uid, hdr.Gid)
}

// clearDir removes what the folder dir holds.
func clearDir(root *os.Root, dir string) error {
	if dir == "" {
		dir = "."
	}
	f, err := root.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := root.RemoveAll(path.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// cleanName makes a tar name relative and refuses one that climbs out ("../x", "a/../../x").
// "" is the root itself.
func cleanName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", errors.New("a name with NUL")
	}
	clean := path.Clean("/" + name)
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%q climbs out of the image", name)
		}
	}
	return strings.TrimPrefix(clean, "/"), nil
}

// readBlob reads a small blob (a manifest) and checks its digest.
func readBlob(layoutDir string, d descriptor) ([]byte, error) {
	f, sum, err := openBlob(layoutDir, d)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	b, err := io.ReadAll(io.TeeReader(io.LimitReader(f, 4<<20), h))
	if err != nil {
		return nil, err
	}
	return b, checkSum(h, sum)
}

// openBlob opens the blob of d, returning its expected sha256.
func openBlob(layoutDir string, d descriptor) (*os.File, []byte, error) {
	hexSum, ok := strings.CutPrefix(d.Digest, "sha256:")
	sum, err := hex.DecodeString(hexSum)
	if !ok || err != nil || len(sum) != sha256.Size {
		return nil, nil, fmt.Errorf("digest %q: want sha256:<64 hex>", d.Digest)
	}
	f, err := os.Open(filepath.Join(layoutDir, "blobs", "sha256", hexSum))
	return f, sum, err
}

func checkSum(h hash.Hash, want []byte) error {
	if got := h.Sum(nil); string(got) != string(want) {
		return fmt.Errorf("blob sha256 %x, want %x: the layout is corrupt", got, want)
	}
	return nil
}

func readJSON(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}
