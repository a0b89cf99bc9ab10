package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
)

// File operations: stat, mkdir, move and delete (proto/files.go), each on directory file
// descriptors (fsat.go). A path is resolved like the other endpoints resolve it (resolveIn:
// parents through links that stay inside the workspace), then the resolved parent is walked
// component by component without following anything, and the act is one *at call relative to
// it. A command that swaps a symlink in meanwhile makes the walk fail, which is retried a few
// times and then answered ErrCodeInvalid; nothing outside the workspace is ever reached.

// trashPrefix names the folders a recursive delete moves a tree into, at the top of the
// workspace, before removing it in the background: one of the server's own names (hidden from
// listings and checkpoints, refused in client paths, removed when the server starts).
const trashPrefix = ".sbx-trash-"

// walkAttempts is how often an operation resolves and walks again after a component changed.
const walkAttempts = 3

// target is a resolved path: its parent directory opened, and its last name there.
type target struct {
	root   dirFD
	parent dirFD
	dir    string // the parent, resolved, relative to the workspace
	base   string
	rel    string // the path as the client gave it, cleaned
}

func (t *target) close() {
	t.parent.close()
	t.root.close()
}

// resolved is the target's path with its parent resolved.
func (t *target) resolved() string { return path.Join(t.dir, t.base) }

// openTarget resolves the client path p (never the workspace itself) to its parent directory,
// opened. The caller closes the target.
func (s *Server) openTarget(p string) (*target, *proto.Error) {
	rel, perr := s.relPath(p, false)
	if perr != nil {
		return nil, perr
	}
	var last error
	for range walkAttempts {
		t, err := s.tryTarget(rel)
		if err == nil {
			return t, nil
		}
		var perr *proto.Error
		if errors.As(err, &perr) {
			return nil, perr
		}
		if !errors.Is(err, errChanged) {
			return nil, fsError(err)
		}
		last = err
	}
	return nil, errorf(proto.ErrCodeInvalid, "%s: %v", absName(rel), last)
}

// tryTarget resolves and walks once: a *proto.Error is final, errChanged worth a retry.
func (s *Server) tryTarget(rel string) (*target, error) {
	dir, perr := s.resolveDir(rel, path.Dir(rel))
	if perr != nil {
		return nil, perr
	}
	rfd, err := s.openRootFD()
	if err != nil {
		return nil, fsError(err)
	}
	pfd, err := walkDir(rfd, dir)
	if err != nil {
		rfd.close()
		return nil, err
	}
	return &target{root: rfd, parent: pfd, dir: dir, base: path.Base(rel), rel: rel}, nil
}

// resolveDir resolves dir (following links inside the workspace) for the client path rel,
// refusing a result inside one of the server's own folders.
func (s *Server) resolveDir(rel, dir string) (string, *proto.Error) {
	root, err := os.OpenRoot(s.ws)
	if err != nil {
		return "", fsError(err)
	}
	res, perr := s.resolve(root, dir, true)
	root.Close()
	if perr != nil {
		if perr.Code == proto.ErrCodeInvalid {
			perr = errorf(proto.ErrCodeInvalid, "%s: %s (through .. or a symlink)", absName(rel), perr.Message)
		}
		return "", perr
	}
	if own := ownNameIn(res); own != "" {
		return "", errorf(proto.ErrCodeInvalid, "%s leads into %s, one of the guest init's own folders", absName(rel), own)
	}
	return res, nil
}

// statInfo converts a stat of name (client path rel) into a FileInfo.
func statInfo(rel, name string, st *unix.Stat_t) proto.FileInfo {
	fi := proto.FileInfo{
		Name:    name,
		Path:    absName(rel),
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		IsDir:   st.Mode&unix.S_IFMT == unix.S_IFDIR,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		Type:    fileTypeOf(st.Mode),
	}
	if fi.IsDir {
		fi.Size = 0
	}
	return fi
}

// infoAt stats base in the target's parent, with a symlink's target.
func (t *target) info(name string) (proto.FileInfo, error) {
	st, err := lstatAt(t.parent, name)
	if err != nil {
		return proto.FileInfo{}, err
	}
	fi := statInfo(t.rel, path.Base(t.rel), &st)
	if fi.Type == proto.FileTypeSymlink {
		fi.Symlink, _ = readlinkAt(t.parent, name)
	}
	return fi, nil
}

func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	rel, perr := s.relPath(r.URL.Query().Get("path"), true)
	if perr != nil {
		writeError(w, perr)
		return
	}
	if rel == "." {
		var st unix.Stat_t
		if err := unix.Stat(s.ws, &st); err != nil {
			writeError(w, fsError(err))
			return
		}
		writeJSON(w, http.StatusOK, statInfo(".", path.Base(proto.Workspace), &st))
		return
	}
	t, perr := s.openTarget(rel)
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer t.close()
	fi, err := t.info(t.base)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) handleMkdir(w http.ResponseWriter, r *http.Request) {
	rel, perr := s.relPath(r.URL.Query().Get("path"), false)
	if perr != nil {
		writeError(w, perr)
		return
	}
	for attempt := 1; ; attempt++ {
		res, err := s.mkdirAll(rel)
		if err == nil {
			writeJSON(w, http.StatusOK, res)
			return
		}
		if perr, ok := err.(*proto.Error); ok {
			writeError(w, perr)
			return
		}
		if !errors.Is(err, errChanged) || attempt == walkAttempts {
			writeError(w, mkdirError(rel, err))
			return
		}
	}
}

// mkdirAll makes rel and its missing parents (0755). Its last component may be a link to a
// directory inside the workspace, which counts as the directory existing (as mkdir -p).
func (s *Server) mkdirAll(rel string) (proto.MkdirResult, error) {
	res, perr := s.resolveDir(rel, rel)
	if perr != nil {
		return proto.MkdirResult{}, perr
	}
	if res == "." {
		return proto.MkdirResult{}, errorf(proto.ErrCodeExists, "%s is the workspace itself", absName(rel))
	}
	cur, err := s.openRootFD()
	if err != nil {
		return proto.MkdirResult{}, fsError(err)
	}
	created := false
	parts := strings.Split(res, "/")
	var parent dirFD = -1
	defer func() {
		cur.close()
		if parent >= 0 {
			parent.close()
		}
	}()
	for i, part := range parts {
		last := i == len(parts)-1
		next, err := openDirAt(cur, part)
		if errors.Is(err, syscall.ENOENT) {
			err = unix.Mkdirat(int(cur), part, 0o755)
			if err == nil {
				created = last
			} else if !errors.Is(err, syscall.EEXIST) {
				return proto.MkdirResult{}, err
			}
			next, err = openDirAt(cur, part)
		}
		if err != nil {
			if errors.Is(err, syscall.ENOTDIR) && last {
				return proto.MkdirResult{}, syscall.EEXIST
			}
			return proto.MkdirResult{}, err
		}
		if last {
			parent, cur = cur, next
		} else {
			cur.close()
			cur = next
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(cur), &st); err != nil {
		return proto.MkdirResult{}, err
	}
	return proto.MkdirResult{FileInfo: statInfo(rel, path.Base(rel), &st), Created: created}, nil
}

func mkdirError(rel string, err error) *proto.Error {
	switch {
	case errors.Is(err, syscall.EEXIST):
		return errorf(proto.ErrCodeExists, "%s exists and is not a directory", absName(rel))
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(proto.ErrCodeNotDir, "a parent of %s is not a directory", absName(rel))
	case errors.Is(err, errChanged):
		return errorf(proto.ErrCodeInvalid, "%s: %v", absName(rel), err)
	}
	return fsError(err)
}

func (s *Server) handleMove(w http.ResponseWriter, r *http.Request) {
	var req proto.MoveRequest
	if perr := readJSON(r, &req, 64<<10); perr != nil {
		writeError(w, perr)
		return
	}
	from, perr := s.openTarget(req.From)
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer from.close()
	to, perr := s.openTarget(req.To)
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer to.close()
	src, dst := from.resolved(), to.resolved()
	switch {
	case src == dst:
		writeError(w, errorf(proto.ErrCodeInvalid, "%s and %s are the same file", absName(from.rel), absName(to.rel)))
		return
	case strings.HasPrefix(dst, src+"/"):
		writeError(w, errorf(proto.ErrCodeInvalid, "cannot move %s into itself (%s)", absName(from.rel), absName(to.rel)))
		return
	}
	if _, err := lstatAt(from.parent, from.base); err != nil {
		writeError(w, fsError(err))
		return
	}
	err := renameAt(from.parent, from.base, to.parent, to.base, req.Overwrite)
	if err != nil {
		writeError(w, moveError(from.rel, to.rel, err))
		return
	}
	fi, err := to.info(to.base)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// renameAt renames, refusing an existing target with EEXIST unless overwrite. Without
// overwrite it asks for RENAME_NOREPLACE; where that answers EINVAL (gVisor has no flags for
// renameat2, and EINVAL is also a directory moved into itself) it checks the target and
// renames in two steps, the plain rename telling the rest.
func renameAt(fromDir dirFD, from string, toDir dirFD, to string, overwrite bool) error {
	if overwrite {
		return unix.Renameat(int(fromDir), from, int(toDir), to)
	}
	err := unix.Renameat2(int(fromDir), from, int(toDir), to, unix.RENAME_NOREPLACE)
	if !errors.Is(err, syscall.EINVAL) {
		return err
	}
	if _, err := lstatAt(toDir, to); err == nil {
		return syscall.EEXIST
	} else if !errors.Is(err, syscall.ENOENT) {
		return err
	}
	return unix.Renameat(int(fromDir), from, int(toDir), to)
}

func moveError(from, to string, err error) *proto.Error {
	switch {
	case errors.Is(err, syscall.EEXIST):
		return errorf(proto.ErrCodeExists, "%s exists (pass overwrite to replace it)", absName(to))
	case errors.Is(err, syscall.ENOTEMPTY):
		return errorf(proto.ErrCodeNotEmpty, "%s is a directory that is not empty", absName(to))
	case errors.Is(err, syscall.EISDIR):
		return errorf(proto.ErrCodeIsDir, "%s is a directory and %s is not", absName(to), absName(from))
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(proto.ErrCodeNotDir, "%s is a directory and %s is not", absName(from), absName(to))
	case errors.Is(err, syscall.EINVAL):
		return errorf(proto.ErrCodeInvalid, "cannot move %s into itself (%s)", absName(from), absName(to))
	case errors.Is(err, syscall.EBUSY):
		return errorf(proto.ErrCodeInvalid, "%s or %s is in use as a mount point", absName(from), absName(to))
	}
	return fsError(err)
}

func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, perr := s.openTarget(q.Get("path"))
	if perr != nil {
		writeError(w, perr)
		return
	}
	defer t.close()
	recursive := isTrue(q.Get("recursive"))
	st, err := lstatAt(t.parent, t.base)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err = unix.Unlinkat(int(t.parent), t.base, 0)
		if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EPERM) {
			// Replaced by a directory meanwhile: remove it as one.
			err = s.removeDir(t, recursive)
		}
	} else {
		err = s.removeDir(t, recursive)
	}
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
		writeError(w, errorf(proto.ErrCodeNotEmpty, "%s is a directory that is not empty (delete it recursively)", absName(t.rel)))
	default:
		writeError(w, fsError(err))
	}
}

// removeDir removes the target directory: an empty one at once; a full one, with recursive,
// by moving it into a trash folder at the top of the workspace (one rename: the name is free
// at once, whatever the tree holds) and removing that in the background.
func (s *Server) removeDir(t *target, recursive bool) error {
	err := unix.Unlinkat(int(t.parent), t.base, unix.AT_REMOVEDIR)
	if err == nil || !recursive || !(errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
		if errors.Is(err, syscall.ENOTDIR) {
			// Replaced by a file or link meanwhile: unlink that (never follow it).
			err = unix.Unlinkat(int(t.parent), t.base, 0)
		}
		return err
	}
	trash := randName(trashPrefix)
	if err := unix.Renameat(int(t.parent), t.base, int(t.root), trash); err != nil {
		return err
	}
	s.trash.add(trash)
	return nil
}

// trashBin removes the trash folders in the background, one at a time, in batches (removeTree
// yields after each), so that a tree of a million entries neither holds a request nor keeps
// the guest init from serving others. It ends with the server.
type trashBin struct {
	ws  func() (dirFD, error)
	log *slog.Logger

	mu      sync.Mutex
	queue   []string
	running bool
	ctx     context.Context
	wg      sync.WaitGroup
}

func newTrashBin(ctx context.Context, s *Server) *trashBin {
	return &trashBin{ws: s.openRootFD, log: s.log, ctx: ctx}
}

// add queues a trash folder (a name at the top of the workspace) and starts the remover when
// it is idle.
func (b *trashBin) add(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx.Err() != nil {
		return // closing: the folder stays hidden; the next start removes it
	}
	b.queue = append(b.queue, name)
	if !b.running {
		b.running = true
		b.wg.Add(1)
		go b.run()
	}
}

func (b *trashBin) run() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 || b.ctx.Err() != nil {
			b.running = false
			b.mu.Unlock()
			return
		}
		name := b.queue[0]
		b.queue = b.queue[1:]
		b.mu.Unlock()
		root, err := b.ws()
		if err != nil {
			b.log.Warn("trash: opening the workspace", "err", err)
			continue
		}
		start := time.Now()
		err = removeTree(b.ctx, root, name, runtime.Gosched)
		root.close()
		if err != nil && b.ctx.Err() == nil {
			b.log.Warn("trash: removing a deleted tree", "name", name, "err", err)
		} else if err == nil {
			b.log.Debug("trash: removed a deleted tree", "name", name, "took", time.Since(start))
		}
	}
}

// wait waits for the remover (after the server's context ended).
func (b *trashBin) wait() { b.wg.Wait() }

// removeStaleTrash queues the trash folders a previous run left (a sandbox that stopped while
// a tree was being removed).
func (s *Server) removeStaleTrash() {
	root, err := s.openRootFD()
	if err != nil {
		return
	}
	defer root.close()
	names, _, err := readDirFD(root, 0)
	if err != nil {
		return
	}
	for _, name := range names {
		if isOwnName(name, trashPrefix) {
			s.trash.add(name)
		}
	}
}
