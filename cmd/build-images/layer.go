package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// A file is one entry of a layer made from scratch: a folder, or a regular file whose bytes
// come from src (a path on this machine) or data.
type file struct {
	name string // in the image, relative: "etc/passwd"
	mode int64  // permission bits (and sticky/setuid), e.g. 0o755
	uid  int    // owner and group (0 unless said)
	dir  bool
	src  string
	data []byte
}

// layerWriter writes a reproducible layer tar: entries in the order given (callers sort them),
// every mtime the build's epoch, no access or change times, no user or group names.
type layerWriter struct {
	tw    *tar.Writer
	epoch time.Time
}

func (w *layerWriter) header(h *tar.Header) error {
	h.ModTime, h.AccessTime, h.ChangeTime = w.epoch, time.Time{}, time.Time{}
	h.Uname, h.Gname = "", ""
	h.Format = tar.FormatPAX
	return w.tw.WriteHeader(h)
}

// writeFiles writes files (sorted by name here: a folder comes before what it holds), owned
// by their uid (group the same).
func (w *layerWriter) writeFiles(files []file) error {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.name, b.name) })
	for _, f := range files {
		if f.dir {
			if err := w.header(&tar.Header{Typeflag: tar.TypeDir, Name: f.name + "/", Mode: f.mode, Uid: f.uid, Gid: f.uid}); err != nil {
				return err
			}
			continue
		}
		data := f.data
		if f.src != "" {
			var err error
			if data, err = os.ReadFile(f.src); err != nil {
				return err
			}
		}
		if err := w.header(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, Size: int64(len(data))}); err != nil {
			return err
		}
		if _, err := w.tw.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// rootfsSkip says which paths of a debootstrap rootfs stay out of the image: the folder's
// completion marker (scripts/ensure-rootfs.sh), and what /dev holds (device nodes; every
// runtime mounts its own /dev, and a layer with devices needs root to unpack).
func rootfsSkip(rel string, d fs.DirEntry) bool {
	if rel == ".sbx-complete" {
		return true
	}
	return strings.HasPrefix(rel, "dev/") && !d.IsDir()
}

// writeRootfs writes the tree under root as it is on disk: folders, regular files, symbolic
// links (never followed) and hard links (a second name of a file already written becomes a
// link entry), with their modes and numeric owners; names in lexical order; mtimes the
// epoch. Anything else (sockets, FIFOs, devices outside /dev) is an error: a base image holds
// none.
func (w *layerWriter) writeRootfs(root string) error {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rootfsSkip(rel, d) {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		h := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm()), Uid: int(st.Uid), Gid: int(st.Gid)}
		if fi.Mode()&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
			return w.header(h)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			return w.header(h)
		case fi.Mode().IsRegular():
			if st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := seen[key]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, first
					return w.header(h)
				}
				seen[key] = rel
			}
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			if err := w.header(h); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			n, err := io.Copy(w.tw, f)
			if err == nil && n != fi.Size() {
				err = fmt.Errorf("%s changed while it was read", p)
			}
			return err
		}
		return fmt.Errorf("%s: a %v has no place in a base image", p, fi.Mode().Type())
	})
}

// layerCache keeps each layer's gzip blob under dir, named by the sha256 of its uncompressed
// tar (the layer's diff id): a layer whose tar is unchanged is not compressed again.
type layerCache struct {
	dir string
}

// layer makes a layer of what write puts into a tar. The tar goes to a temporary file while
// its sha256 is taken; the gzip blob comes from the cache, or is made from that file (level
// 6, no name, no time in the gzip header: the same tar always gives the same blob).
func (c layerCache) layer(write func(*layerWriter) error, epoch time.Time) (v1.Layer, error) {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(c.dir, ".tar-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	sum := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(tmp, sum))
	if err := write(&layerWriter{tw: tw, epoch: epoch}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	blob := filepath.Join(c.dir, hex.EncodeToString(sum.Sum(nil))+".tar.gz")
	if _, err := os.Stat(blob); err != nil {
		if err := compress(tmp, blob); err != nil {
			return nil, err
		}
	} else {
		now := time.Now() // used now: the newest to keep (prune)
		if err := os.Chtimes(blob, now, now); err != nil {
			return nil, err
		}
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(blob) },
		tarball.WithMediaType(types.OCILayer))
}

// compress writes the gzip of src (from its start) to dst, through a temporary file.
func compress(src *os.File, dst string) error {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	out, err := os.CreateTemp(filepath.Dir(dst), ".gz-*")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	zw, err := gzip.NewWriterLevel(out, gzip.DefaultCompression)
	if err != nil {
		out.Close()
		return err
	}
	if _, err := io.Copy(zw, src); err != nil {
		out.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(out.Name(), dst)
}

// countBytes reads rc to its end and closes it, returning how many bytes it held.
func countBytes(rc io.ReadCloser) (int64, error) {
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

// prune removes cached blobs beyond the keep most recently used ones (every build marks the
// blobs it uses as used now), so that a cache that gets new layers with every commit stays
// a few builds' size.
func (c layerCache) prune(keep int) error {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	type blob struct {
		name string
		used time.Time
	}
	var blobs []blob
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tar.gz") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		blobs = append(blobs, blob{e.Name(), fi.ModTime()})
	}
	slices.SortFunc(blobs, func(a, b blob) int { return b.used.Compare(a.used) })
	for _, b := range blobs[min(keep, len(blobs)):] {
		if err := os.Remove(filepath.Join(c.dir, b.name)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}
