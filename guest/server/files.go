package server

import (
	"container/heap"
	"crypto/rand"
	"encoding/hex"
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
	"syscall"
	"time"

	"sandboxd/guest/proto"
)

// Names the server makes inside the workspace (randName): a reserved prefix and exactly
// randHexLen lowercase hex digits. Only names of exactly that form are the server's: hidden
// from listings and exports (temp files anywhere, import staging folders at the top) and, for
// staging folders, deleted when the server starts. Anything else a command makes, such as
// .sbx-tmp-notes or .sbx-import-x/y, is a file like any other: listed, exported, kept. The
// files API refuses every path component that starts with a reserved prefix (ErrCodeInvalid),
// so that nothing a client writes can be taken for one of the server's own files.
const (
	importPrefix = ".sbx-import-"
	tmpPrefix    = ".sbx-tmp-"
	randHexLen   = 16
)

// reservedPrefixes are the prefixes the files API refuses in a path.
var reservedPrefixes = []string{tmpPrefix, importPrefix, trashPrefix}

const (
	defaultMaxFileBytes = 1 << 30
	defaultDirLimit     = 1000
	maxDirLimit         = 10000
)

// relPath turns a client path into a path relative to the workspace root: relative paths are
// taken as they are, absolute ones must lie under the workspace (its real path or /workspace).
// Lexical escapes are refused here; os.Root refuses the rest (symlinks) in the kernel walk.
func (s *Server) relPath(p string, allowRoot bool) (string, *proto.Error) {
	if p == "" {
		if allowRoot {
			return ".", nil
		}
		return "", errorf(proto.ErrCodeInvalid, "path is empty")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errorf(proto.ErrCodeInvalid, "path holds a NUL byte")
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		rel, ok := underDir(c, s.ws)
		if !ok {
			rel, ok = underDir(c, proto.Workspace)
		}
		if !ok {
			return "", errorf(proto.ErrCodeInvalid, "path %s is outside the workspace", p)
		}
		p = rel
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errorf(proto.ErrCodeInvalid, "path %s is outside the workspace", p)
	}
	if c == "." && !allowRoot {
		return "", errorf(proto.ErrCodeInvalid, "path %s is the workspace itself", p)
	}
	for part := range strings.SplitSeq(c, "/") {
		for _, prefix := range reservedPrefixes {
			if strings.HasPrefix(part, prefix) {
				return "", errorf(proto.ErrCodeInvalid, "path %s: the name %q is reserved (names starting with %q belong to the guest init's own temporary files)",
					p, part, prefix)
			}
		}
	}
	return c, nil
}

// underDir returns p relative to dir when p is dir or below it.
func underDir(p, dir string) (string, bool) {
	if p == dir {
		return ".", true
	}
	if dir == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir)+1:], true
	}
	return "", false
}

// absName is the path a client sees for a workspace-relative path.
func absName(rel string) string {
	if rel == "." {
		return proto.Workspace
	}
	return proto.Workspace + "/" + rel
}

// fsError converts a file system error into a protocol error.
func fsError(err error) *proto.Error {
	msg := err.Error()
	switch {
	case errors.Is(err, errEscapes):
		return errorf(proto.ErrCodeInvalid, "%v", err)
	case strings.Contains(msg, "path escapes"):
		return errorf(proto.ErrCodeInvalid, "path escapes the workspace: %v", err)
	case errors.Is(err, fs.ErrNotExist):
		return errorf(proto.ErrCodeNotFound, "%v", err)
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(proto.ErrCodeNotDir, "%v", err)
	case errors.Is(err, syscall.EISDIR):
		return errorf(proto.ErrCodeIsDir, "%v", err)
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
		return errorf(proto.ErrCodeInvalid, "directory not empty: %v", err)
	case errors.Is(err, syscall.ELOOP), errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG):
		return errorf(proto.ErrCodeInvalid, "%v", err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errorf(proto.ErrCodeNoSpace, "%s: %v", proto.NoSpaceMessage, err)
	case errors.Is(err, syscall.ENXIO):
		// What opening a socket answers.
		return errorf(proto.ErrCodeInvalid, "%v (a socket or a device: the files API reads and writes regular files)", err)
	}
	return errorf(proto.ErrCodeInternal, "%v", err)
}

// specialKind names the type of a file the files API neither reads nor writes: "" for regular
// files, directories and symlinks.
func specialKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeIrregular != 0:
		return "a file of an unknown type"
	}
	return ""
}

// specialError is the answer to a read or write of a special file.
func specialError(rel, kind string) *proto.Error {
	return errorf(proto.ErrCodeInvalid, "%s is %s: the files API reads and writes regular files only", absName(rel), kind)
}

// goMode converts FileInfo.Mode (or a tar mode) into Go's mode bits.
func goMode(u int64) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func fileInfo(name, p string, fi fs.FileInfo) proto.FileInfo {
	return proto.FileInfo{
		Name:    name,
		Path:    p,
		Size:    fi.Size(),
		Mode:    proto.UnixMode(fi.Mode()),
		IsDir:   fi.IsDir(),
		ModTime: fi.ModTime().UTC(),
		Type:    fileTypeOfMode(fi.Mode()),
	}
}

// randName makes one of the server's own names: prefix and randHexLen random hex digits.
func randName(prefix string) string {
	var b [randHexLen / 2]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// isOwnName reports whether name is exactly of the form randName(prefix) makes.
func isOwnName(name, prefix string) bool {
	if len(name) != len(prefix)+randHexLen || !strings.HasPrefix(name, prefix) {
		return false
	}
	for _, c := range name[len(prefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// openInWorkspace opens the workspace root and, resolved inside it (links are followed only
// within the workspace), the file or folder rel names: read-only, O_NONBLOCK so that a FIFO
// cannot hang a handler, O_NOFOLLOW, and never O_DIRECTORY (with O_NOFOLLOW, the combination
// gVisor gets wrong). It returns the resolved name; the caller closes f and root.
func (s *Server) openInWorkspace(rel string) (*os.Root, string, *os.File, *proto.Error) {
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		return nil, "", nil, fsError(err)
	}
	name, perr := s.resolve(root, rel, true)
	if perr != nil {
		root.Close()
		return nil, "", nil, perr
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		var perr *proto.Error
		if fi, lerr := root.Lstat(name); lerr == nil && specialKind(fi.Mode()) != "" {
			perr = specialError(rel, specialKind(fi.Mode())) // a socket: ENXIO
		} else {
			perr = fsError(err)
		}
		root.Close()
		return nil, "", nil, perr
	}
	return root, name, f, nil
}

func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	rel, perr := s.relPath(r.URL.Query().Get("path"), false)
	if perr != nil {
		writeError(w, perr)
		return
	}
	root, _, f, perr := s.openInWorkspace(rel)
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer root.Close()
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	if fi.IsDir() {
		writeError(w, errorf(proto.ErrCodeIsDir, "%s is a directory", absName(rel)))
		return
	}
	if !fi.Mode().IsRegular() {
		if kind := specialKind(fi.Mode()); kind != "" {
			writeError(w, specialError(rel, kind))
			return
		}
		writeError(w, errorf(proto.ErrCodeInvalid, "%s is not a regular file", absName(rel)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	h.Set(proto.HeaderSize, strconv.FormatInt(fi.Size(), 10))
	h.Set(proto.HeaderMode, fmt.Sprintf("%04o", proto.UnixMode(fi.Mode())))
	h.Set(proto.HeaderModTime, fi.ModTime().UTC().Format(time.RFC3339Nano))
	w.WriteHeader(http.StatusOK)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	if _, err := io.CopyBuffer(w, io.LimitReader(f, fi.Size()), *bp); err != nil {
		if r.Context().Err() == nil {
			panic(http.ErrAbortHandler) // a short body must not look complete
		}
	}
}

func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rel, perr := s.relPath(q.Get("path"), false)
	if perr != nil {
		writeError(w, perr)
		return
	}
	mode := int64(0o644)
	if v := q.Get("mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o7777 {
			writeError(w, errorf(proto.ErrCodeInvalid, "bad mode %q (octal, at most 7777)", v))
			return
		}
		mode = int64(m)
	}
	limit := int64(defaultMaxFileBytes)
	if v := q.Get("max"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, errorf(proto.ErrCodeInvalid, "bad max %q", v))
			return
		}
		limit = n
	}
	if r.ContentLength > limit {
		writeError(w, errorf(proto.ErrCodeTooLarge, "file of %d bytes is over the limit of %d", r.ContentLength, limit))
		return
	}
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	defer root.Close()
	// The parent is followed through links (a link to a directory is written into); the
	// file itself replaces whatever is there, a symlink included, and is never written
	// through.
	dir, perr := s.resolve(root, path.Dir(rel), true)
	if perr != nil {
		writeError(w, perr)
		return
	}
	target := path.Join(dir, path.Base(rel))
	if dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			if errors.Is(err, syscall.EEXIST) {
				writeError(w, errorf(proto.ErrCodeNotDir, "a parent of %s is not a directory", absName(rel)))
				return
			}
			writeError(w, fsError(err))
			return
		}
	}
	if fi, err := root.Lstat(target); err == nil && fi.IsDir() {
		writeError(w, errorf(proto.ErrCodeIsDir, "%s is a directory", absName(rel)))
		return
	} else if err == nil && specialKind(fi.Mode()) != "" {
		// Replacing a socket or a FIFO a command listens on is not what a write means.
		writeError(w, specialError(rel, specialKind(fi.Mode())))
		return
	}
	tmp := path.Join(dir, randName(tmpPrefix))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	bp := bufPool.Get().(*[]byte)
	n, err := io.CopyBuffer(onlyWrite(f), io.LimitReader(r.Body, limit+1), *bp)
	bufPool.Put(bp)
	if err == nil {
		err = f.Chmod(goMode(mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)):
		_ = root.Remove(tmp)
		writeError(w, errorf(proto.ErrCodeNoSpace, "%s: writing %s: %v", proto.NoSpaceMessage, absName(rel), err))
		return
	case err != nil:
		_ = root.Remove(tmp)
		writeError(w, errorf(proto.ErrCodeInvalid, "writing %s: %v", absName(rel), err))
		return
	case n > limit:
		_ = root.Remove(tmp)
		writeError(w, errorf(proto.ErrCodeTooLarge, "file is over the limit of %d bytes", limit))
		return
	}
	if err := root.Rename(tmp, target); err != nil {
		_ = root.Remove(tmp)
		writeError(w, fsError(err))
		return
	}
	fi, err := root.Lstat(target)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	writeJSON(w, http.StatusOK, fileInfo(path.Base(rel), absName(rel), fi))
}

func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rel, perr := s.relPath(q.Get("path"), true)
	if perr != nil {
		writeError(w, perr)
		return
	}
	limit := defaultDirLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, errorf(proto.ErrCodeInvalid, "bad limit %q", v))
			return
		}
		if n > 0 {
			limit = min(n, maxDirLimit)
		}
	}
	ordered, after := false, q.Get("after")
	switch o := q.Get("order"); o {
	case "":
		if after != "" {
			writeError(w, errorf(proto.ErrCodeInvalid, "after needs order=name"))
			return
		}
	case "name":
		ordered = true
		if after != "" && !proto.ValidEntryName(after) {
			writeError(w, errorf(proto.ErrCodeInvalid, "after must be one name of the folder"))
			return
		}
	default:
		writeError(w, errorf(proto.ErrCodeInvalid, "bad order %q", o))
		return
	}
	root, dir, f, perr := s.openInWorkspace(rel)
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer root.Close()
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		writeError(w, fsError(err))
		return
	} else if !fi.IsDir() {
		if kind := specialKind(fi.Mode()); kind != "" {
			writeError(w, errorf(proto.ErrCodeNotDir, "%s is %s, not a directory", absName(rel), kind))
			return
		}
		writeError(w, errorf(proto.ErrCodeNotDir, "%s is not a directory", absName(rel)))
		return
	}
	var entries []fs.DirEntry
	truncated := false
	if ordered {
		var err error
		if entries, truncated, err = pageAfter(f, dir, after, limit); err != nil {
			writeError(w, fsError(err))
			return
		}
	}
	for !ordered && !truncated {
		batch, err := f.ReadDir(256)
		for _, e := range batch {
			if hiddenName(dir, e.Name()) {
				continue
			}
			if len(entries) == limit {
				truncated = true
				break
			}
			entries = append(entries, e)
		}
		if err != nil || len(batch) == 0 {
			break
		}
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	out := proto.DirListing{Entries: make([]proto.FileInfo, 0, len(entries)), Truncated: truncated, Ordered: ordered}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		p := path.Join(rel, e.Name())
		info := fileInfo(e.Name(), p, fi)
		if fi.Mode()&fs.ModeSymlink != 0 {
			info.Symlink, _ = root.Readlink(path.Join(dir, e.Name()))
		}
		out.Entries = append(out.Entries, info)
	}
	writeJSON(w, http.StatusOK, out)
}

// pageAfter reads the folder f (dir, relative to the workspace) to its end and answers the
// limit entries with the smallest names after after ("": from the first), in byte order, and
// whether more follow them. It keeps only limit+1 entries (a max-heap by name) and lstats
// none, so a page costs O(limit) memory and answer bytes however large the folder is; the
// names themselves are read in batches, as the kernel hands them out.
func pageAfter(f *os.File, dir, after string, limit int) ([]fs.DirEntry, bool, error) {
	h := &nameHeap{}
	for {
		batch, err := f.ReadDir(256)
		for _, e := range batch {
			name := e.Name()
			if name <= after || hiddenName(dir, name) {
				continue
			}
			switch {
			case h.Len() <= limit:
				heap.Push(h, e)
			case name < (*h)[0].Name():
				(*h)[0] = e
				heap.Fix(h, 0)
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, false, err
		}
	}
	entries := []fs.DirEntry(*h)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if len(entries) > limit {
		return entries[:limit], true, nil
	}
	return entries, false, nil
}

// nameHeap is a max-heap of folder entries by name (container/heap).
type nameHeap []fs.DirEntry

func (h nameHeap) Len() int           { return len(h) }
func (h nameHeap) Less(i, j int) bool { return h[i].Name() > h[j].Name() }
func (h nameHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nameHeap) Push(x any)        { *h = append(*h, x.(fs.DirEntry)) }
func (h *nameHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// hiddenName reports the server's own transient files (temp files anywhere, import staging
// and trash folders at the top): names of exactly the form randName makes, nothing else.
func hiddenName(dir, name string) bool {
	return isOwnName(name, tmpPrefix) || (dir == "." && (isOwnName(name, importPrefix) || isOwnName(name, trashPrefix)))
}
