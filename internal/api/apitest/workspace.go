package apitest

import (
	"bytes"
	"context"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// Workspace is a Fake whose file calls (OpenFile, ReadFile, WriteFile, ListDir) work on an
// in-memory workspace of SandboxRunning instead of answering fixtures: files, folders, links
// and special files, resolved as the guest init resolves them (a path that leaves /workspace,
// through ".." or a link, is INVALID_ARGUMENT; a link to an absolute path under /workspace is
// followed, any other absolute target escapes). Every other call is the Fake's.
type Workspace struct {
	*Fake

	mu    sync.Mutex
	nodes map[string]Node // by clean relative path; "." is /workspace
	// ListHook, when set, may change what ListDir answers (a hostile server's names).
	ListHook func(dir string, entries []sandbox.FileInfo) []sandbox.FileInfo
}

var _ api.Service = (*Workspace)(nil)

// Node is one entry of a Workspace.
type Node struct {
	Dir     bool
	Data    []byte
	Mode    os.FileMode // permission bits; 0: 0644 for files, 0755 for folders
	Link    string      // a symbolic link's target
	Special bool        // a FIFO: listed, never read or written
}

// NewWorkspace returns a Workspace over a new Fake, with an empty /workspace.
func NewWorkspace() *Workspace {
	return &Workspace{Fake: New(), nodes: map[string]Node{".": {Dir: true, Mode: 0o755}}}
}

// Put sets the entry at a relative path, making its parent folders.
func (w *Workspace) Put(p string, n Node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p = path.Clean(p)
	for d := path.Dir(p); d != "."; d = path.Dir(d) {
		if _, ok := w.nodes[d]; !ok {
			w.nodes[d] = Node{Dir: true, Mode: 0o755}
		}
	}
	w.nodes[p] = n
}

// Entry answers the entry at a relative path, links not followed.
func (w *Workspace) Entry(p string) (Node, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, ok := w.nodes[path.Clean(p)]
	return n, ok
}

// Paths are the entries' relative paths, sorted.
func (w *Workspace) Paths() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for p := range w.nodes {
		if p != "." {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func outside(p string) error {
	return apierror.New(apierror.InvalidArgument, "path %s is outside the workspace", p)
}

// resolve answers the relative path p names with every link followed (the last one only when
// followLast), and the node there, if any.
func (w *Workspace) resolve(p string, followLast bool) (string, Node, bool, error) {
	if p == "" {
		return "", Node{}, false, apierror.New(apierror.InvalidArgument, "path is required")
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		switch {
		case c == "/workspace":
			p = "."
		case strings.HasPrefix(c, "/workspace/"):
			p = strings.TrimPrefix(c, "/workspace/")
		default:
			return "", Node{}, false, outside(p)
		}
	}
	if c := path.Clean(p); c == ".." || strings.HasPrefix(c, "../") {
		return "", Node{}, false, outside(p)
	}
	pending := strings.Split(path.Clean(p), "/")
	var done []string
	for links := 0; len(pending) > 0; {
		name := pending[0]
		pending = pending[1:]
		switch name {
		case ".", "":
			continue
		case "..":
			if len(done) == 0 {
				return "", Node{}, false, apierror.New(apierror.InvalidArgument, "path escapes the workspace")
			}
			done = done[:len(done)-1]
			continue
		}
		cur := path.Join(append(done, name)...)
		n, ok := w.nodes[cur]
		if !ok {
			return path.Join(append(append(done, name), pending...)...), Node{}, false, nil
		}
		if n.Link != "" && (len(pending) > 0 || followLast) {
			if links++; links > 40 {
				return "", Node{}, false, apierror.New(apierror.InvalidArgument, "too many links")
			}
			target := n.Link
			if path.IsAbs(target) {
				c := path.Clean(target)
				if c != "/workspace" && !strings.HasPrefix(c, "/workspace/") {
					return "", Node{}, false, apierror.New(apierror.InvalidArgument, "path escapes the workspace")
				}
				done, target = nil, strings.TrimPrefix(strings.TrimPrefix(c, "/workspace"), "/")
			}
			pending = append(strings.Split(target, "/"), pending...)
			continue
		}
		if len(pending) > 0 && !n.Dir {
			return "", Node{}, false, apierror.New(apierror.InvalidArgument, "%s is not a directory", cur)
		}
		done = append(done, name)
	}
	rel := path.Join(done...)
	if rel == "" {
		rel = "."
	}
	n, ok := w.nodes[rel]
	return rel, n, ok, nil
}

func (w *Workspace) info(rel string, n Node) sandbox.FileInfo {
	mode := uint32(n.Mode)
	if mode == 0 {
		mode = 0o644
		if n.Dir {
			mode = 0o755
		}
	}
	return sandbox.FileInfo{Name: path.Base(rel), Path: "/workspace/" + rel, Size: int64(len(n.Data)), Mode: mode, IsDir: n.Dir,
		Symlink: n.Link, ModTime: T0}
}

// open answers a file's bytes and info, or the guest's error.
func (w *Workspace) open(p auth.Principal, id, file string) ([]byte, sandbox.FileInfo, error) {
	if _, err := lookup(p, id); err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	rel, n, ok, err := w.resolve(file, true)
	switch {
	case err != nil:
		return nil, sandbox.FileInfo{}, err
	case !ok:
		return nil, sandbox.FileInfo{}, apierror.New(apierror.NotFound, "%s: no such file", file)
	case n.Dir:
		return nil, sandbox.FileInfo{}, apierror.New(apierror.InvalidArgument, "/workspace/%s is a directory", rel)
	case n.Special:
		return nil, sandbox.FileInfo{}, apierror.New(apierror.InvalidArgument, "/workspace/%s is a FIFO, not a regular file", rel)
	}
	return bytes.Clone(n.Data), w.info(rel, n), nil
}

// OpenFile answers a file of the workspace.
func (w *Workspace) OpenFile(_ context.Context, p auth.Principal, id, file string) (io.ReadCloser, sandbox.FileInfo, error) {
	w.record(Call{Method: "OpenFile", Principal: p, SandboxID: id, Path: file})
	data, fi, err := w.open(p, id, file)
	if err != nil {
		return nil, fi, err
	}
	return io.NopCloser(bytes.NewReader(data)), fi, nil
}

// ReadFile answers a file of the workspace, PAYLOAD_TOO_LARGE over maxBytes.
func (w *Workspace) ReadFile(_ context.Context, p auth.Principal, id, file string, maxBytes int64) ([]byte, sandbox.FileInfo, error) {
	w.record(Call{Method: "ReadFile", Principal: p, SandboxID: id, Path: file, MaxBytes: maxBytes})
	data, fi, err := w.open(p, id, file)
	if err == nil && maxBytes > 0 && int64(len(data)) > maxBytes {
		return nil, sandbox.FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is too large", file)
	}
	return data, fi, err
}

// WriteFile writes a file, making its parents; a link at its name is replaced, never
// written through; a folder, a special file or a path outside the workspace there is
// INVALID_ARGUMENT.
func (w *Workspace) WriteFile(_ context.Context, p auth.Principal, id, file string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error) {
	data, readErr := io.ReadAll(r)
	w.record(Call{Method: "WriteFile", Principal: p, SandboxID: id, Path: file, Mode: mode, Data: data})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	if readErr != nil {
		return sandbox.FileInfo{}, readErr
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// As the guest: the parent is resolved through links, the file replaces whatever is at its
	// name, a link included, and is never written through.
	rel, n, ok, err := w.resolve(file, false)
	switch {
	case err != nil:
		return sandbox.FileInfo{}, err
	case rel == ".", ok && n.Dir:
		return sandbox.FileInfo{}, apierror.New(apierror.InvalidArgument, "/workspace/%s is a directory", rel)
	case ok && n.Special:
		return sandbox.FileInfo{}, apierror.New(apierror.InvalidArgument, "/workspace/%s is a FIFO", rel)
	}
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if pn, ok := w.nodes[d]; !ok {
			w.nodes[d] = Node{Dir: true, Mode: 0o755}
		} else if !pn.Dir {
			return sandbox.FileInfo{}, apierror.New(apierror.InvalidArgument, "/workspace/%s is not a directory", d)
		}
	}
	if mode == 0 {
		mode = 0o644
	}
	w.nodes[rel] = Node{Data: data, Mode: mode}
	return w.info(rel, w.nodes[rel]), nil
}

// ListDir lists a folder, sorted by name, at most limit entries (1000 when 0).
func (w *Workspace) ListDir(_ context.Context, p auth.Principal, id, dir string, limit int) ([]sandbox.FileInfo, bool, error) {
	w.record(Call{Method: "ListDir", Principal: p, SandboxID: id, Path: dir, Limit: limit})
	if _, err := lookup(p, id); err != nil {
		return nil, false, err
	}
	w.mu.Lock()
	rel, n, ok, err := w.resolve(dir, true)
	switch {
	case err != nil:
	case !ok:
		err = apierror.New(apierror.NotFound, "%s: no such folder", dir)
	case !n.Dir:
		err = apierror.New(apierror.InvalidArgument, "/workspace/%s is not a directory", rel)
	}
	var out []sandbox.FileInfo
	if err == nil {
		for q, n := range w.nodes {
			if q != "." && path.Dir(q) == rel {
				out = append(out, w.info(q, n))
			}
		}
	}
	hook := w.ListHook
	w.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	slices.SortFunc(out, func(a, b sandbox.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	if hook != nil {
		out = hook(rel, out)
	}
	if limit <= 0 {
		limit = 1000
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}
