package server

import (
	"archive/tar"
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
	"unsafe"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
	"sandboxd/internal/tarsafe"
)

// Import limits when the request does not set them.
const (
	defaultImportMaxBytes = 10 << 30
	defaultImportMaxFiles = 1_000_000
)

// importOptions are the query parameters of PUT /v1/workspace/tar.
type importOptions struct {
	replace       bool
	maxBytes      int64
	maxFiles      int64
	externalLinks bool
	// writers is how many goroutines write small files' content (0: the reading goroutine
	// writes everything; see fileWriters).
	writers int
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
		writers:       s.opts.ImportWriters,
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
	res, perr := importTar(s.ws, r.Body, opts)
	if perr != nil {
		if perr.Code == proto.ErrCodeInternal {
			s.log.Error("guest: importing a workspace failed", "err", perr.Message)
		}
		writeError(w, perr)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// ImportTarOptions are ImportTar's options.
type ImportTarOptions struct {
	// Replace removes the folder's old top-level entries before the new ones move in;
	// otherwise the tar is merged over it.
	Replace bool
	// MaxBytes and MaxFiles bound the content (0: 10 GiB and 1,000,000 files).
	MaxBytes, MaxFiles int64
	// AllowExternalSymlinks keeps symlinks whose target lies outside the folder.
	AllowExternalSymlinks bool
	// Writers is how many goroutines write the content of small files while the tar is read
	// on (0: none, the reading goroutine writes every file). Each file is still created, in
	// the tar's order, by the reading goroutine.
	Writers int
}

// ImportTar extracts a workspace tar into dir with the rules of the guest's import (a staging
// folder inside dir, tarsafe's name and type rules, nothing written below or in the place of a
// symlink, hard links to regular files only), and moves the staged entries into place only when
// the whole stream was read without error. The local runtime extracts a new box's workspace on
// the host with it, before the box starts. Errors are *proto.Error.
func ImportTar(dir string, body io.Reader, o ImportTarOptions) (proto.ImportResult, error) {
	opts := importOptions{replace: o.Replace, maxBytes: o.MaxBytes, maxFiles: o.MaxFiles, externalLinks: o.AllowExternalSymlinks,
		writers: o.Writers}
	if opts.maxBytes <= 0 {
		opts.maxBytes = defaultImportMaxBytes
	}
	if opts.maxFiles <= 0 {
		opts.maxFiles = defaultImportMaxFiles
	}
	res, perr := importTar(dir, body, opts)
	if perr != nil {
		return res, perr
	}
	return res, nil
}

// importTar stages, extracts and installs a tar into the folder ws.
func importTar(ws string, body io.Reader, opts importOptions) (proto.ImportResult, *proto.Error) {
	root, err := os.OpenRoot(ws)
	if err != nil {
		return proto.ImportResult{}, fsError(err)
	}
	defer root.Close()
	staging := randName(importPrefix)
	if err := root.Mkdir(staging, 0o700); err != nil {
		return proto.ImportResult{}, fsError(err)
	}
	defer func() { _ = root.RemoveAll(staging) }()
	sroot, err := root.OpenRoot(staging)
	if err != nil {
		return proto.ImportResult{}, fsError(err)
	}
	defer sroot.Close()
	res, perr := extract(ws, sroot, body, opts)
	if perr != nil {
		return res, perr
	}
	if err := install(root, staging, opts.replace); err != nil {
		return res, errorf(proto.ErrCodeInternal, "installing the imported workspace: %v", err)
	}
	return res, nil
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
// ws is the workspace's path (what an absolute symlink target may point into).
func extract(ws string, sroot *os.Root, body io.Reader, opts importOptions) (proto.ImportResult, *proto.Error) {
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
	var fw *fileWriters
	if opts.writers > 0 {
		fw = newFileWriters(opts.writers)
		defer fw.stop() // before dc.close: the writers' files are in its folders
	}
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
			if fw != nil && hdr.Size <= fileJobMax {
				// The file exists now, in the tar's order (a later entry of the same name
				// finds it, a hard link links to it); its content follows on a writer.
				j := fw.job()
				n, err := io.ReadFull(tr, j.buf[:hdr.Size])
				res.Bytes += int64(n)
				if err != nil {
					f.Close()
					fw.put(j)
					return res, fail(err)
				}
				j.f, j.n, j.name, j.mode, j.mtime = f, n, hdr.Name, goMode(hdr.Mode), hdr.ModTime
				if perr := fw.submit(j); perr != nil {
					return res, perr
				}
				continue
			}
			n, err := io.CopyBuffer(onlyWrite(f), tr, *bp)
			res.Bytes += n
			if err = finishFile(f, goMode(hdr.Mode), hdr.ModTime, err); err != nil {
				if br.over || br.err != nil || errors.Is(err, io.ErrUnexpectedEOF) {
					return res, fail(err)
				}
				return res, entryError(hdr.Name, err)
			}
		case tar.TypeSymlink:
			if hdr.Linkname == "" {
				return res, errorf(proto.ErrCodeInvalid, "symlink %q has no target", hdr.Name)
			}
			if !opts.externalLinks && linkEscapes(ws, name, hdr.Linkname) {
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
	if fw != nil {
		if perr := fw.wait(); perr != nil {
			return res, perr
		}
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

// finishFile gives a file the extraction wrote (err: the writing's) its mode and time, unless
// the writing failed, and closes it; it returns the first error.
func finishFile(f *os.File, mode fs.FileMode, mtime time.Time, err error) error {
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && !mtime.IsZero() {
		setFileTimes(f, mtime)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// setFileTimes sets the access and modification times of the open file f to t, as futimens
// does (utimensat of the descriptor itself), best effort like the Chtimes it replaces: no
// path is looked up again, which on a restore of thousands of files was 15% of the time.
func setFileTimes(f *os.File, t time.Time) {
	ts, err := unix.TimeToTimespec(t)
	if err != nil {
		return
	}
	times := [2]unix.Timespec{ts, ts}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		// A nil path: the descriptor's own file (what glibc's futimens does).
		_, _, _ = unix.Syscall6(unix.SYS_UTIMENSAT, fd, 0, uintptr(unsafe.Pointer(&times[0])), 0, 0, 0)
	})
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
func linkEscapes(ws, name, target string) bool {
	if path.IsAbs(target) {
		c := path.Clean(target)
		_, in := underDir(c, proto.Workspace)
		if !in {
			_, in = underDir(c, ws)
		}
		return !in
	}
	return tarsafe.Escapes(path.Join(path.Dir(name), target))
}
