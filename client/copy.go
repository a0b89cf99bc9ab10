package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Default bounds of CopyIn and CopyOut.
const (
	DefaultCopyMaxFiles = 10000
	DefaultCopyMaxBytes = 4 << 30
)

// CopyOptions bound a copy between the local file system and a workspace. Zero values take
// the defaults.
type CopyOptions struct {
	// MaxFiles bounds the files and folders a copy visits (DefaultCopyMaxFiles).
	MaxFiles int
	// MaxBytes bounds the bytes a copy moves, all files together (DefaultCopyMaxBytes).
	MaxBytes int64
	// OnFile, when set, is told of every file copied and every entry skipped.
	OnFile func(CopiedFile)
}

// CopiedFile is one entry of a copy.
type CopiedFile struct {
	// Remote is the entry's workspace path, Local its local path.
	Remote string `json:"remote"`
	Local  string `json:"local"`
	Size   int64  `json:"size"`
	IsDir  bool   `json:"is_dir,omitempty"`
	// Skipped says why the entry was not copied; "" when it was.
	Skipped string `json:"skipped,omitempty"`
}

// CopyResult sums a copy up.
type CopyResult struct {
	// Dest is where the copy went: a workspace path (CopyIn) or a local path (CopyOut).
	Dest  string `json:"dest"`
	Files int    `json:"files"`
	Dirs  int    `json:"dirs"`
	Bytes int64  `json:"bytes"`
	// Skipped are the entries not copied (links, special files, folders the API cannot
	// make), with the reason.
	Skipped []CopiedFile `json:"skipped,omitempty"`
}

// CopyError is a copy refused on the local side: a link named as the source, an entry the
// server named outside its folder, a bound reached, a destination of the wrong kind. Nothing
// was written for the entry it names.
type CopyError struct {
	Path   string
	Reason string
}

func (e *CopyError) Error() string { return e.Path + ": " + e.Reason }

func (o CopyOptions) withDefaults() CopyOptions {
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultCopyMaxFiles
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultCopyMaxBytes
	}
	return o
}

// copyState counts what a copy moved against its bounds.
type copyState struct {
	opts CopyOptions
	res  CopyResult
	seen int
}

func (s *copyState) visit(p string) error {
	if s.seen++; s.seen > s.opts.MaxFiles {
		return &CopyError{Path: p, Reason: fmt.Sprintf("more than %d files and folders to copy (raise the bound)", s.opts.MaxFiles)}
	}
	return nil
}

func (s *copyState) copied(f CopiedFile) {
	if f.IsDir {
		s.res.Dirs++
	} else {
		s.res.Files++
		s.res.Bytes += f.Size
	}
	if s.opts.OnFile != nil {
		s.opts.OnFile(f)
	}
}

func (s *copyState) skip(f CopiedFile) {
	s.res.Skipped = append(s.res.Skipped, f)
	if s.opts.OnFile != nil {
		s.opts.OnFile(f)
	}
}

// left is what MaxBytes still allows.
func (s *copyState) left() int64 { return s.opts.MaxBytes - s.res.Bytes }

// ---- local → workspace ----

// CopyIn copies a local file, or a folder with everything in it, into a sandbox's workspace,
// as cp does: into remote when remote is a folder (or ends with "/"), else to remote itself.
// Files keep their permission bits; parents are created.
//
// It never follows a link: a link named as the source is refused, links and special files
// inside a folder are skipped (CopyResult.Skipped), and the folder is read through an
// os.Root, so nothing outside it is read even when the tree changes during the copy. Folders
// are made as the parents of their files, and those that hold no file with MakeDir. The
// workspace side is the server's: a remote path that leaves the
// workspace, through ".." or a link, is its INVALID_ARGUMENT, and a link where a file lands is
// replaced by the file (the server's atomic write), its target never written.
func (c *Client) CopyIn(ctx context.Context, sandboxID, local, remote string, opts CopyOptions) (CopyResult, error) {
	st := &copyState{opts: opts.withDefaults()}
	fi, err := os.Lstat(local)
	if err != nil {
		return st.res, err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return st.res, &CopyError{Path: local, Reason: "is a symbolic link; cp never follows links (name its target)"}
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return st.res, &CopyError{Path: local, Reason: "is not a regular file or folder"}
	}
	kind, err := c.remoteKind(ctx, sandboxID, remote)
	if err != nil {
		return st.res, err
	}
	dest := strings.TrimRight(remote, "/")
	switch {
	case kind == remoteDir || (kind == remoteMissing && strings.HasSuffix(remote, "/")):
		dest = joinRemote(dest, filepath.Base(filepath.Clean(local)))
	case kind == remoteFile && fi.IsDir():
		return st.res, &CopyError{Path: remote, Reason: "exists and is not a folder"}
	}
	if dest == "" {
		dest = "."
	}
	st.res.Dest = dest
	if !fi.IsDir() {
		if err := st.visit(local); err != nil {
			return st.res, err
		}
		f, err := openNoFollow(local)
		if err != nil {
			return st.res, err
		}
		defer f.Close()
		return st.res, c.uploadOne(ctx, st, sandboxID, f, local, dest)
	}
	root, err := os.OpenRoot(local)
	if err != nil {
		return st.res, err
	}
	defer root.Close()
	// filled marks the folders under which a file was written: the others are not made.
	filled := map[string]bool{}
	var dirs []string
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, werr error) error {
		if werr != nil {
			return werr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := st.visit(p); err != nil {
			return err
		}
		lp, rp := filepath.Join(local, filepath.FromSlash(p)), joinRemote(dest, p)
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			target, _ := root.Readlink(p)
			st.skip(CopiedFile{Remote: rp, Local: lp, Skipped: "a symbolic link (to " + target + "); cp never follows links"})
			return nil
		case d.IsDir():
			dirs = append(dirs, p)
			return nil
		case !t.IsRegular():
			st.skip(CopiedFile{Remote: rp, Local: lp, Skipped: "a special file (" + t.String() + ")"})
			return nil
		}
		f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := c.uploadOne(ctx, st, sandboxID, f, lp, rp); err != nil {
			return err
		}
		for d := path.Dir(p); ; d = path.Dir(d) {
			filled[d] = true
			if d == "." {
				break
			}
		}
		return nil
	})
	if err != nil {
		return st.res, err
	}
	for _, p := range dirs {
		rp, lp := joinRemote(dest, p), filepath.Join(local, filepath.FromSlash(p))
		if !filled[p] {
			// No file made it as a parent: make it (and its missing parents) alone.
			if err := ctx.Err(); err != nil {
				return st.res, err
			}
			if _, _, err := c.MakeDir(ctx, sandboxID, rp); err != nil {
				return st.res, err
			}
		}
		st.copied(CopiedFile{Remote: rp, Local: lp, IsDir: true})
	}
	return st.res, nil
}

// uploadOne writes one open local file to the workspace path rp: its size as it was opened,
// at most, and its permission bits.
func (c *Client) uploadOne(ctx context.Context, st *copyState, sandboxID string, f *os.File, lp, rp string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return &CopyError{Path: lp, Reason: "is not a regular file"}
	}
	if fi.Size() > st.left() {
		return &CopyError{Path: lp, Reason: fmt.Sprintf("copying it would pass the bound of %d bytes (raise the bound)", st.opts.MaxBytes)}
	}
	mode := fi.Mode().Perm()
	if mode == 0 {
		mode = 0o400 // 0 would be the server's default, 0644: never widen
	}
	if _, err := c.WriteFile(ctx, sandboxID, rp, io.LimitReader(f, fi.Size()), mode); err != nil {
		return err
	}
	st.copied(CopiedFile{Remote: rp, Local: lp, Size: fi.Size()})
	return nil
}

// openNoFollow opens a regular local file without following a link in its last component and
// without blocking on a FIFO swapped in meanwhile.
func openNoFollow(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
}

type remoteKindOf int

const (
	remoteMissing remoteKindOf = iota
	remoteDir
	remoteFile
)

// remoteKind tells whether a workspace path is a folder, missing, or something else (a file,
// or a path the server refuses, which the write then answers).
func (c *Client) remoteKind(ctx context.Context, sandboxID, remote string) (remoteKindOf, error) {
	p := strings.TrimRight(remote, "/")
	if p == "" {
		p = "."
	}
	_, err := c.ListFiles(ctx, sandboxID, p, 1)
	switch {
	case err == nil:
		return remoteDir, nil
	case IsCode(err, CodeNotFound):
		// The sandbox itself may be the missing thing: Get tells.
		if _, gerr := c.Get(ctx, sandboxID); gerr != nil {
			return 0, gerr
		}
		return remoteMissing, nil
	case IsCode(err, CodeInvalidArgument):
		return remoteFile, nil
	}
	return 0, err
}

func joinRemote(dir, name string) string {
	if name == "." || name == "" {
		return dir
	}
	if dir == "" || dir == "." {
		return name
	}
	return strings.TrimRight(dir, "/") + "/" + name
}

// ---- workspace → local ----

// CopyOut copies a workspace file, or a folder with everything in it, to the local file
// system, as cp does: into local when it is an existing folder, else to local itself (whose
// parent must exist). Files keep their permission bits and modification times.
//
// Every write goes through an os.Root of the destination's folder and lands by a rename, so
// nothing is written outside it: not through a link already there (the link is replaced, its
// target untouched), not through a name the server answered (a name with a slash, "." or ".."
// is refused). Stat tells the source's kind first: a special file named as the source is
// refused without a read. Links inside a workspace folder are skipped, never followed; a file
// the server refuses to read (a special file, a link swapped in meanwhile) is skipped with its
// reason. A link named as the source is the server's to resolve: one that leaves the workspace
// is its INVALID_ARGUMENT, and nothing is written.
func (c *Client) CopyOut(ctx context.Context, sandboxID, remote, local string, opts CopyOptions) (CopyResult, error) {
	st := &copyState{opts: opts.withDefaults()}
	var (
		rc      io.ReadCloser
		info    FileInfo
		listing FileList
		isDir   bool
	)
	// Stat tells a file from a folder; a link (reported as itself) is the server's to resolve
	// when it is read or listed, as is anything from a server that does not say the type.
	fi, err := c.Stat(ctx, sandboxID, remote)
	if err != nil {
		return st.res, err
	}
	switch fi.Type {
	case "DIRECTORY":
		if listing, err = c.listAll(ctx, sandboxID, remote); err != nil {
			return st.res, err
		}
		isDir = true
	case "FILE":
		if rc, info, err = c.openFileInfo(ctx, sandboxID, remote); err != nil {
			return st.res, err
		}
		defer rc.Close()
	case "SYMLINK", "":
		var openErr error
		rc, info, openErr = c.openFileInfo(ctx, sandboxID, remote)
		if openErr != nil {
			if !IsCode(openErr, CodeInvalidArgument) {
				return st.res, openErr
			}
			l, err := c.listAll(ctx, sandboxID, remote)
			if err != nil {
				return st.res, openErr // not a folder either: the read's answer says why
			}
			listing, isDir = l, true
		} else {
			defer rc.Close()
		}
	default:
		return st.res, &CopyError{Path: remote, Reason: "is a " + strings.ToLower(strings.ReplaceAll(fi.Type, "_", " ")) + "; cp copies files and folders"}
	}
	name := path.Base(path.Clean("/" + strings.TrimRight(remote, "/")))
	if name == "/" || (isDir && strings.Trim(remote, "/.") == "") {
		name = "" // the workspace itself
	}
	dir, base := local, name
	lfi, err := os.Stat(local)
	switch {
	case err == nil && lfi.IsDir():
	case err == nil && isDir:
		return st.res, &CopyError{Path: local, Reason: "exists and is not a folder"}
	case err == nil || errors.Is(err, fs.ErrNotExist):
		if strings.HasSuffix(local, string(filepath.Separator)) && !isDir {
			return st.res, &CopyError{Path: local, Reason: "no such folder"}
		}
		dir, base = filepath.Dir(filepath.Clean(local)), filepath.Base(filepath.Clean(local))
	default:
		return st.res, err
	}
	if base == "" && !isDir {
		return st.res, &CopyError{Path: remote, Reason: "has no name to copy it to; name the local file"}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st.res, err
	}
	defer root.Close()
	st.res.Dest = filepath.Join(dir, base)
	if err := st.visit(remote); err != nil {
		return st.res, err
	}
	if !isDir {
		size, err := writeLocal(root, base, rc, info, st)
		if err != nil {
			return st.res, err
		}
		st.copied(CopiedFile{Remote: remote, Local: st.res.Dest, Size: size})
		return st.res, nil
	}
	rel := "."
	if base != "" {
		rel = base
		if err := mkdirLocal(root, rel); err != nil {
			return st.res, err
		}
	}
	return st.res, c.copyDirOut(ctx, st, root, sandboxID, strings.TrimRight(remote, "/"), rel, dir, listing)
}

// copyDirOut copies the entries of the workspace folder remote (listed) into rel of root.
func (c *Client) copyDirOut(ctx context.Context, st *copyState, root *os.Root, sandboxID, remote, rel, dir string, listing FileList) error {
	if rel != "." {
		st.copied(CopiedFile{Remote: remote, Local: filepath.Join(dir, filepath.FromSlash(rel)), IsDir: true})
	}
	for _, e := range listing.Entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		rp := joinRemote(remote, e.Name)
		if !safeName(e.Name) {
			return &CopyError{Path: rp, Reason: fmt.Sprintf("the server answered the entry name %q, which is not one name in this folder; nothing written for it", e.Name)}
		}
		if err := st.visit(rp); err != nil {
			return err
		}
		lrel := path.Join(rel, e.Name)
		lp := filepath.Join(dir, filepath.FromSlash(lrel))
		switch {
		case e.Symlink != "":
			st.skip(CopiedFile{Remote: rp, Local: lp, Skipped: "a symbolic link (to " + e.Symlink + "); cp never follows links"})
		case e.IsDir:
			sub, err := c.listAll(ctx, sandboxID, rp)
			if err != nil {
				return err
			}
			if err := mkdirLocal(root, lrel); err != nil {
				return err
			}
			if err := c.copyDirOut(ctx, st, root, sandboxID, rp, lrel, dir, sub); err != nil {
				return err
			}
		default:
			rc, info, err := c.openFileInfo(ctx, sandboxID, rp)
			if IsCode(err, CodeInvalidArgument) || IsCode(err, CodeNotFound) {
				var e *Error
				errors.As(err, &e)
				st.skip(CopiedFile{Remote: rp, Local: lp, Skipped: "the server refused to read it: " + e.Message})
				continue
			}
			if err != nil {
				return err
			}
			size, err := writeLocal(root, lrel, rc, info, st)
			rc.Close()
			if err != nil {
				return err
			}
			st.copied(CopiedFile{Remote: rp, Local: lp, Size: size})
		}
	}
	return nil
}

// listAll lists a workspace folder whole: the server's default page, then its largest when
// that was not all; a folder larger than that is refused rather than copied in part.
func (c *Client) listAll(ctx context.Context, sandboxID, remote string) (FileList, error) {
	p := strings.TrimRight(remote, "/")
	if p == "" {
		p = "."
	}
	l, err := c.ListFiles(ctx, sandboxID, p, 0)
	if err == nil && l.Truncated {
		l, err = c.ListFiles(ctx, sandboxID, p, maxListEntries)
	}
	if err == nil && l.Truncated {
		return l, &CopyError{Path: remote, Reason: fmt.Sprintf("holds more than %d entries; copy its subfolders one by one", len(l.Entries))}
	}
	return l, err
}

// maxListEntries is the largest listing CopyOut asks for (the server's default bound).
const maxListEntries = 10000

// safeName reports whether a listed name is one name inside its folder.
func safeName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\x00")
}

func mkdirLocal(root *os.Root, rel string) error {
	fi, err := root.Lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return root.Mkdir(rel, 0o755)
	case err != nil:
		return err
	case !fi.IsDir():
		return &CopyError{Path: rel, Reason: "exists and is not a folder (a link is never followed)"}
	}
	return nil
}

// writeLocal writes r to rel in root through a new temporary file renamed over rel, so an
// existing link at rel is replaced, never written through. It keeps to the copy's byte bound.
func writeLocal(root *os.Root, rel string, r io.Reader, info FileInfo, st *copyState) (int64, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(path.Dir(rel), ".sandboxctl-"+hex.EncodeToString(rnd[:]))
	mode := os.FileMode(0o644)
	if m, err := strconv.ParseUint(info.Mode, 8, 32); err == nil {
		mode = os.FileMode(m) & 0o777
	}
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600)
	if err != nil {
		return 0, err
	}
	left := st.left()
	n, err := io.Copy(f, io.LimitReader(r, left+1))
	if err == nil && n > left {
		err = &CopyError{Path: rel, Reason: fmt.Sprintf("copying it would pass the bound of %d bytes (raise the bound)", st.opts.MaxBytes)}
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && !info.ModTime.IsZero() {
		err = root.Chtimes(tmp, info.ModTime, info.ModTime)
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return 0, err
	}
	return n, nil
}

// openFileInfo streams a workspace file with what its answer says of it (size, mode, time).
func (c *Client) openFileInfo(ctx context.Context, sandboxID, p string) (io.ReadCloser, FileInfo, error) {
	req, err := c.request(ctx, http.MethodGet, withQuery(sandboxPath(sandboxID, "files"), url.Values{"path": {p}}), nil)
	if err != nil {
		return nil, FileInfo{}, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, FileInfo{}, err
	}
	fi := FileInfo{Name: path.Base(p), Path: p, Size: resp.ContentLength, Mode: resp.Header.Get("X-File-Mode")}
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		fi.ModTime = t
	}
	return resp.Body, fi, nil
}
