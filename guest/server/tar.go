package server

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
	"sandboxd/internal/tarsafe"
)

// Import limits when the request does not set them.
const (
	defaultImportMaxBytes = 10 << 30
	defaultImportMaxFiles = 1_000_000
)

// handleExport streams the workspace as an uncompressed tar: directories, regular files and
// symlinks (as symlinks); hard links become regular files, sockets and devices are skipped.
// The entry count is sent as the trailer X-Sbx-Files. A failure midway aborts the stream, so
// a client never mistakes a partial tar for a whole one.
func (s *Server) handleExport(w http.ResponseWriter, r *http.Request) {
	if _, err := os.Stat(s.ws); err != nil {
		writeError(w, fsError(err))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Trailer", proto.HeaderFiles)
	w.WriteHeader(http.StatusOK)
	files, err := WriteTar(r.Context(), s.ws, w)
	if err != nil {
		if r.Context().Err() == nil {
			s.log.Warn("guest: workspace export failed", "err", err)
		}
		panic(http.ErrAbortHandler)
	}
	w.Header().Set(proto.HeaderFiles, strconv.Itoa(files))
}

// WriteTar writes the tree under dir to w as an uncompressed tar (directories, regular files,
// symlinks as symlinks; sockets, devices and FIFOs skipped; the guest's own temporary files
// left out) and returns the number of entries. It never follows a symlink, so it is safe on a
// tree that untrusted code changes while it runs. The local driver uses it on the host
// workspace folder; the guest init on /workspace.
func WriteTar(ctx context.Context, dir string, w io.Writer) (int, error) {
	top, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer top.Close()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	// Batch tar's many small writes (a 512-byte header per entry) into large writes: each
	// write to an HTTP/2 response is a round trip with the connection's serving goroutine.
	bw := bufio.NewWriterSize(w, 1<<20)
	e := &exporter{ctx: ctx, tw: tar.NewWriter(bw), buf: *bp}
	if err := e.dir(top, ""); err != nil {
		return e.files, err
	}
	if err := e.tw.Close(); err != nil {
		return e.files, err
	}
	return e.files, bw.Flush()
}

// exporter walks the workspace with directory descriptors: every stat and open is one
// syscall relative to its parent's descriptor (no per-component path resolution, which costs a
// gofer round trip per component under gVisor), never following a symlink.
type exporter struct {
	ctx   context.Context
	tw    *tar.Writer
	buf   []byte
	files int
}

// dir writes the entries of the open directory d, whose archive path is prefix ("" for the
// workspace itself, else ending in "/").
func (e *exporter) dir(d *os.File, prefix string) error {
	dirfd := int(d.Fd())
	for {
		ents, rerr := d.ReadDir(512)
		for _, ent := range ents {
			name := ent.Name()
			parent := "."
			if prefix != "" {
				parent = strings.TrimSuffix(prefix, "/")
			}
			if hiddenName(parent, name) {
				continue
			}
			if err := e.ctx.Err(); err != nil {
				return err
			}
			if err := e.entry(dirfd, name, prefix+name); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

func (e *exporter) entry(dirfd int, name, p string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil // removed while we walked
		}
		return &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	hdr := &tar.Header{Name: p, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix())}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
				return nil
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		sub := os.NewFile(uintptr(fd), p)
		defer sub.Close()
		if !sameFile(fd, &st) {
			return nil // swapped while we walked (e.g. for a symlink): skip it
		}
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		if err := e.tw.WriteHeader(hdr); err != nil {
			return err
		}
		e.files++
		return e.dir(sub, hdr.Name)
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return nil
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = string(buf[:n])
		e.files++
		return e.tw.WriteHeader(hdr)
	case unix.S_IFREG:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			if err == unix.ENOENT || err == unix.ELOOP {
				return nil
			}
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			return &fs.PathError{Op: "stat", Path: p, Err: err}
		}
		if fst.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fst.Size
		hdr.Mode = int64(fst.Mode & 0o7777)
		hdr.ModTime = time.Unix(fst.Mtim.Unix())
		if err := e.tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.CopyBuffer(e.tw, io.LimitReader(f, hdr.Size), e.buf)
		if err != nil {
			return err
		}
		if n < hdr.Size {
			// The file shrank while we read it: pad, to keep the archive consistent.
			if _, err := io.CopyN(e.tw, zeroReader{}, hdr.Size-n); err != nil {
				return err
			}
		}
		e.files++
		return nil
	}
	return nil // sockets, devices, FIFOs
}

// sameFile reports whether the open descriptor fd is the file st describes.
func sameFile(fd int, st *unix.Stat_t) bool {
	var got unix.Stat_t
	return unix.Fstat(fd, &got) == nil && got.Dev == st.Dev && got.Ino == st.Ino
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// importOptions are the query parameters of PUT /v1/workspace/tar.
type importOptions struct {
	replace       bool
	maxBytes      int64
	maxFiles      int64
	externalLinks bool
}

// handleImport extracts a tar into a staging folder inside the workspace, and only when the
// whole body was read without error moves the staged entries into place (replace=1 removes
// the old top-level entries first). A body that breaks midway leaves the workspace untouched.
func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := importOptions{
		replace:       isTrue(q.Get("replace")),
		maxBytes:      defaultImportMaxBytes,
		maxFiles:      defaultImportMaxFiles,
		externalLinks: isTrue(q.Get("external_symlinks")),
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"max_bytes", &opts.maxBytes}, {"max_files", &opts.maxFiles}} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, errorf(proto.ErrCodeInvalid, "bad %s %q", p.name, v))
				return
			}
			*p.v = n
		}
	}

	s.importMu.Lock()
	defer s.importMu.Unlock()
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	defer root.Close()
	staging := randName(importPrefix)
	if err := root.Mkdir(staging, 0o700); err != nil {
		writeError(w, fsError(err))
		return
	}
	defer func() { _ = root.RemoveAll(staging) }()
	sroot, err := root.OpenRoot(staging)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	defer sroot.Close()

	res, perr := s.extract(sroot, r.Body, opts)
	if perr != nil {
		writeError(w, perr)
		return
	}
	if err := install(root, staging, opts.replace); err != nil {
		s.log.Error("guest: installing an imported workspace failed", "err", err)
		writeError(w, errorf(proto.ErrCodeInternal, "installing the imported workspace: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// bodyReader counts the raw body and remembers a transport error, so that a body that broke
// (the caller aborted the request) is never mistaken for a tar that ended.
type bodyReader struct {
	r    io.Reader
	n    int64
	max  int64
	err  error
	over bool
}

var errBodyTooLarge = errors.New("body over the limit")

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.n >= b.max {
		b.over = true
		return 0, errBodyTooLarge
	}
	p = p[:min(int64(len(p)), b.max-b.n)]
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

type dirMeta struct {
	mode  fs.FileMode
	mtime time.Time
}

// extract unpacks the tar into sroot (the staging folder) with every check applied.
func (s *Server) extract(sroot *os.Root, body io.Reader, opts importOptions) (proto.ImportResult, *proto.Error) {
	// Headers cost at least 512 bytes; allow generous room for them beyond the content.
	rawMax := opts.maxBytes + min(opts.maxFiles, 1<<40)*4096 + 1<<20
	if rawMax < 0 {
		rawMax = 1 << 62
	}
	br := &bodyReader{r: body, max: rawMax}
	fail := func(err error) *proto.Error {
		switch {
		case br.over:
			return errorf(proto.ErrCodeTooLarge, "tar stream over %d bytes", rawMax)
		case br.err != nil:
			return errorf(proto.ErrCodeInvalid, "reading the tar stream: %v", br.err)
		}
		return errorf(proto.ErrCodeInvalid, "bad tar stream: %v", err)
	}
	tr := tar.NewReader(br)
	var res proto.ImportResult
	dirs := make(map[string]dirMeta)
	// links holds the symlinks this tar created. Nothing goes through one (the sources' rule):
	// no entry lies below one, no directory replaces one, no hard link's target goes through
	// one. So no path the extraction uses has a symlink among its folders, and os.Root never
	// walks one (which gVisor would follow: see resolveIn).
	links := make(map[string]bool)
	// linkAbove returns the symlink of this tar that name lies below ("" for none).
	linkAbove := func(name string) string {
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if links[p] {
				return p
			}
		}
		return ""
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	dc := newDirCache(sroot)
	defer dc.close()
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fail(err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := tarsafe.CleanDeepName(hdr.Name)
		if err != nil {
			return res, nameError(hdr.Name, err)
		}
		if name == "." {
			if hdr.Typeflag == tar.TypeDir {
				continue
			}
			return res, errorf(proto.ErrCodeInvalid, "tar entry %q is not a directory", hdr.Name)
		}
		if own := ownNameIn(name); own != "" {
			// It would be hidden from listings and exports (and, at the top, deleted at the
			// next start): refuse it rather than lose it silently.
			return res, errorf(proto.ErrCodeInvalid, "tar entry %q: the name %q is one the guest init makes for its own temporary files", hdr.Name, own)
		}
		if res.Files++; res.Files > opts.maxFiles {
			return res, errorf(proto.ErrCodeTooLarge, "tar holds more than %d files", opts.maxFiles)
		}
		if l := linkAbove(name); l != "" {
			return res, errorf(proto.ErrCodeInvalid, "tar entry %q lies below the symlink %q", hdr.Name, l)
		}
		if hdr.Typeflag == tar.TypeDir && links[name] {
			return res, errorf(proto.ErrCodeInvalid, "tar entry %q replaces a symlink with a directory", hdr.Name)
		}
		// parent is name's folder, opened once per folder and extraction (every operation below
		// is then one step from its descriptor instead of a walk from the root per call, which
		// costs a gofer round trip per path component under gVisor).
		var parent *os.Root
		base := path.Base(name)
		switch hdr.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			// Most entries are new files: their folder is enough, O_EXCL below finds the rest.
			var err error
			if parent, err = dc.dir(path.Dir(name)); err != nil {
				return res, entryError(hdr.Name, err)
			}
			delete(links, name)
		default:
			var perr *proto.Error
			if parent, perr = dc.prepare(name); perr != nil {
				return res, perr
			}
			delete(links, name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if _, err := dc.dir(name); err != nil {
				return res, entryError(hdr.Name, err)
			}
			dirs[name] = dirMeta{goMode(hdr.Mode), hdr.ModTime}
		case tar.TypeReg:
			if res.Bytes+hdr.Size > opts.maxBytes {
				return res, errorf(proto.ErrCodeTooLarge, "tar content over %d bytes", opts.maxBytes)
			}
			f, err := parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, fs.ErrExist) {
				// A later entry replaces an earlier one (never a folder, never through a link).
				if _, perr := dc.prepare(name); perr != nil {
					return res, perr
				}
				f, err = parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			}
			if err != nil {
				return res, entryError(hdr.Name, err)
			}
			n, err := io.CopyBuffer(f, tr, *bp)
			res.Bytes += n
			if err == nil {
				err = f.Chmod(goMode(hdr.Mode))
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				if br.over || br.err != nil || errors.Is(err, io.ErrUnexpectedEOF) {
					return res, fail(err)
				}
				return res, entryError(hdr.Name, err)
			}
			if !hdr.ModTime.IsZero() {
				_ = parent.Chtimes(base, hdr.ModTime, hdr.ModTime)
			}
		case tar.TypeSymlink:
			if hdr.Linkname == "" {
				return res, errorf(proto.ErrCodeInvalid, "symlink %q has no target", hdr.Name)
			}
			if !opts.externalLinks && s.linkEscapes(name, hdr.Linkname) {
				return res, errorf(proto.ErrCodeInvalid, "symlink %q -> %q points outside the workspace", hdr.Name, hdr.Linkname)
			}
			if err := parent.Symlink(hdr.Linkname, base); err != nil {
				return res, entryError(hdr.Name, err)
			}
			links[name] = true
		case tar.TypeLink:
			target, err := tarsafe.CleanDeepName(hdr.Linkname)
			if errors.Is(err, tarsafe.ErrComponentTooLong) {
				return res, errorf(proto.ErrCodeInvalid, "hard link %q -> %q: the target %v", hdr.Name, hdr.Linkname, err)
			}
			if err != nil || target == "." {
				return res, errorf(proto.ErrCodeInvalid, "hard link %q -> %q points outside the workspace", hdr.Name, hdr.Linkname)
			}
			if l := linkAbove(target); l != "" {
				return res, errorf(proto.ErrCodeInvalid, "hard link %q -> %q goes through the symlink %q", hdr.Name, hdr.Linkname, l)
			}
			// Only to a regular file (as the sources' rule has it): a hard link to a symlink
			// is a second copy of the link, whose relative target, read from another folder,
			// can point out of the workspace.
			if fi, err := sroot.Lstat(target); err == nil && !fi.Mode().IsRegular() {
				return res, errorf(proto.ErrCodeInvalid, "hard link %q -> %q does not point to a regular file", hdr.Name, hdr.Linkname)
			}
			if err := sroot.Link(target, name); err != nil {
				return res, entryError(hdr.Name, err)
			}
		default:
			return res, typeError(hdr)
		}
	}
	// Read the body to its end: a caller that checks a hash fails the request only there.
	if _, err := io.CopyBuffer(io.Discard, br, *bp); err != nil || br.err != nil {
		return res, fail(err)
	}
	// Directory modes last (a read-only directory must not stop its own extraction), deepest
	// first.
	names := make([]string, 0, len(dirs))
	for name := range dirs {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, name := range names {
		m := dirs[name]
		if err := sroot.Chmod(name, m.mode); err != nil {
			return res, entryError(name, err)
		}
		if !m.mtime.IsZero() {
			_ = sroot.Chtimes(name, m.mtime, m.mtime)
		}
	}
	return res, nil
}

// dirCache holds the folders an extraction created or entered, each opened once as an
// os.Root of its own: a descriptor that never lets an operation escape it, so writing through
// it is as safe as through the staging root, and costs one step instead of a walk.
type dirCache struct {
	root  *os.Root
	roots map[string]*os.Root
}

func newDirCache(root *os.Root) *dirCache {
	return &dirCache{root: root, roots: map[string]*os.Root{}}
}

func (c *dirCache) close() {
	for _, r := range c.roots {
		r.Close()
	}
}

// dir returns the folder name (relative to the staging root, "." for it), creating it and its
// parents as needed. An existing non-folder there is an error (as MkdirAll's).
func (c *dirCache) dir(name string) (*os.Root, error) {
	if name == "." {
		return c.root, nil
	}
	if r, ok := c.roots[name]; ok {
		return r, nil
	}
	parent, err := c.dir(path.Dir(name))
	if err != nil {
		return nil, err
	}
	base := path.Base(name)
	if err := parent.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	r, err := parent.OpenRoot(base)
	if err != nil {
		// os.Root answers a file where a folder should be with an error that is no errno
		// ("not a directory"): make it ENOTDIR, a client's mistake, not an internal error.
		if fi, lerr := parent.Lstat(base); lerr == nil && !fi.IsDir() {
			err = &fs.PathError{Op: "open", Path: name, Err: unix.ENOTDIR}
		}
		return nil, err
	}
	c.roots[name] = r
	return r, nil
}

// prepare creates the parents of name and removes whatever non-directory is already there (a
// later tar entry replaces an earlier one; it is never written through a symlink). It returns
// name's folder.
func (c *dirCache) prepare(name string) (*os.Root, *proto.Error) {
	parent, err := c.dir(path.Dir(name))
	if err != nil {
		return nil, entryError(name, err)
	}
	base := path.Base(name)
	fi, err := parent.Lstat(base)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return parent, nil
	case err != nil:
		return nil, entryError(name, err)
	case fi.IsDir():
		return nil, errorf(proto.ErrCodeInvalid, "tar entry %q replaces a directory", name)
	}
	if err := parent.Remove(base); err != nil {
		return nil, entryError(name, err)
	}
	return parent, nil
}

func entryError(name string, err error) *proto.Error {
	e := fsError(err)
	if e.Code == proto.ErrCodeNotFound || e.Code == proto.ErrCodeNotDir || e.Code == proto.ErrCodeIsDir {
		e.Code = proto.ErrCodeInvalid
	}
	e.Message = fmt.Sprintf("tar entry %q: %s", name, e.Message)
	return e
}

// ownNameIn returns the first component of the clean relative path name that hiddenName hides
// ("" for none).
func ownNameIn(name string) string {
	dir := "."
	for part := range strings.SplitSeq(name, "/") {
		if hiddenName(dir, part) {
			return part
		}
		dir = path.Join(dir, part)
	}
	return ""
}

// nameError is the answer to an entry name that tarsafe's rule refuses: an over-long component
// by what it is, everything else (empty, NUL, absolute, "..") as an escape.
func nameError(name string, err error) *proto.Error {
	if errors.Is(err, tarsafe.ErrComponentTooLong) {
		return errorf(proto.ErrCodeInvalid, "tar entry %q %v", name, err)
	}
	return errorf(proto.ErrCodeInvalid, "tar entry %q escapes the workspace", name)
}

// typeError is the answer to an entry whose type tarsafe's rule refuses: a device or FIFO as
// such, anything else as unsupported.
func typeError(hdr *tar.Header) *proto.Error {
	err := tarsafe.CheckType(hdr.Typeflag)
	if errors.Is(err, tarsafe.ErrCharDevice) || errors.Is(err, tarsafe.ErrBlockDevice) || errors.Is(err, tarsafe.ErrFIFO) {
		return errorf(proto.ErrCodeInvalid, "tar entry %q is a device or FIFO", hdr.Name)
	}
	return errorf(proto.ErrCodeInvalid, "tar entry %q has unsupported type %q", hdr.Name, hdr.Typeflag)
}

// linkEscapes reports whether a symlink at name with this target resolves (lexically, from
// the link's final place) outside the workspace: a relative target by tarsafe's rule, an
// absolute one unless it lies under the workspace.
func (s *Server) linkEscapes(name, target string) bool {
	if path.IsAbs(target) {
		c := path.Clean(target)
		_, in := underDir(c, proto.Workspace)
		if !in {
			_, in = underDir(c, s.ws)
		}
		return !in
	}
	return tarsafe.Escapes(path.Join(path.Dir(name), target))
}

// install moves the staged entries into the workspace.
func install(root *os.Root, staging string, replace bool) error {
	if replace {
		old, err := readDirNames(root, ".")
		if err != nil {
			return err
		}
		for _, name := range old {
			if name == staging {
				continue
			}
			if err := root.RemoveAll(name); err != nil {
				return err
			}
		}
	}
	return merge(root, staging, ".")
}

// merge moves every entry of src into dst; directories present on both sides are merged,
// anything else in dst is replaced.
func merge(root *os.Root, src, dst string) error {
	names, err := readDirNames(root, src)
	if err != nil {
		return err
	}
	for _, name := range names {
		from, to := path.Join(src, name), path.Join(dst, name)
		have, err := root.Lstat(to)
		if err == nil {
			want, err := root.Lstat(from)
			if err != nil {
				return err
			}
			if have.IsDir() && want.IsDir() {
				if err := merge(root, from, to); err != nil {
					return err
				}
				_ = root.Chmod(to, want.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
				_ = root.Chtimes(to, want.ModTime(), want.ModTime())
				continue
			}
			if err := root.RemoveAll(to); err != nil {
				return err
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := root.Rename(from, to); err != nil {
			return err
		}
	}
	return nil
}

func readDirNames(root *os.Root, dir string) ([]string, error) {
	f, err := root.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// removeStaleImports deletes staging folders left by an import that was cut short: only names
// of exactly the form the server makes (a command's .sbx-import-notes is kept).
func (s *Server) removeStaleImports() {
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		return
	}
	defer root.Close()
	names, err := readDirNames(root, ".")
	if err != nil {
		return
	}
	for _, name := range names {
		if isOwnName(name, importPrefix) {
			_ = root.RemoveAll(name)
		}
	}
}
