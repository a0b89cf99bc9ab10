package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// ErrInvalidKey means that LocalStore refused an object key (see LocalStore for the rules).
var ErrInvalidKey = errors.New("invalid object key")

// LocalStore is an ObjectStore over a local folder: the embedded default.
//
// The object "a/b/c" is the file {dir}/a/b/c, byte for byte, so ordinary tools can inspect it.
// A key is one or more slash-separated segments, none of them empty, and none starting with
// "." (which also refuses "." and ".."); an absolute key or one with "//" is refused with
// ErrInvalidKey. Names starting with "." belong to the store itself:
//
//   - {dir}/a/b/.tmp-*: a Put in flight (or left by a crash); List ignores it.
//   - {dir}/a/b/.c.meta.json: the sidecar with the content type and metadata of c, present only
//     when the object has some. It records the size and modification time of the data file it
//     describes; a sidecar that does not match the data file (a crash between the two writes, or
//     an object replaced since) is ignored, so metadata is never reported for the wrong version.
//     The data file is published first and its sidecar right after: for a moment a reader may
//     see a new object without its metadata. Sidecars are not fsynced: metadata is advisory.
//
// Put writes a temporary file in the object's folder, fsyncs it, then publishes it with
// os.Link (IfNotExists: the link fails when the key exists) or os.Rename (overwrite), and
// fsyncs the folder. Delete removes folders that it leaves empty. Unlike GCS, a key cannot be
// both an object and a prefix of another ("a" and "a/b"). The folder must support hard links.
type LocalStore struct {
	root string
}

var _ ObjectStore = (*LocalStore)(nil)

// NewLocalStore returns a LocalStore over dir, creating the folder if needed.
func NewLocalStore(dir string) (*LocalStore, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("local store %s: %w", dir, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	return &LocalStore{root: root}, nil
}

// Dir is the folder that holds the objects.
func (s *LocalStore) Dir() string { return s.root }

// Path is the file that holds key's data (whether or not it exists).
func (s *LocalStore) Path(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// Put implements ObjectStore.
func (s *LocalStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectAttrs, error) {
	path, err := s.Path(key)
	if err != nil {
		return ObjectAttrs{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	dir := filepath.Dir(path)
	f, err := s.createTemp(dir, ".tmp-*")
	if err != nil {
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	tmp, renamed := f.Name(), false
	defer func() {
		if !renamed { // after a Link, tmp is an extra name of the object
			os.Remove(tmp)
		}
	}()

	// Hide File.ReadFrom so that CopyBuffer uses buf and ctxReader sees every read.
	_, err = io.CopyBuffer(struct{ io.Writer }{f}, ctxReader{ctx: ctx, r: r}, make([]byte, 256<<10))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = ctx.Err() // a cancelled Put publishes nothing
	}
	if err != nil {
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	if opts.IfNotExists {
		if err := os.Link(tmp, path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, ErrPrecondition)
			}
			return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
		}
	} else {
		if err := os.Rename(tmp, path); err != nil {
			return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
		}
		renamed = true
	}
	err = syncDir(dir)
	if err == nil {
		err = s.writeSidecar(path, fi, opts)
	}
	if err != nil {
		// Published but not durable, or without its metadata: a failed Put leaves no object
		// (an overwritten one is lost too).
		os.Remove(path)
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	return ObjectAttrs{Key: key, Size: fi.Size(), Created: fi.ModTime(),
		ContentType: opts.ContentType, Metadata: copyMetadata(opts.Metadata)}, nil
}

// Get implements ObjectStore. Reads fail once ctx is done.
func (s *LocalStore) Get(ctx context.Context, key string) (io.ReadCloser, ObjectAttrs, error) {
	path, err := s.Path(key)
	if err != nil {
		return nil, ObjectAttrs{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, ObjectAttrs{}, fmt.Errorf("get %s: %w", key, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, ObjectAttrs{}, fmt.Errorf("get %s: %w", key, notExist(err))
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = ErrNotExist
	}
	if err != nil {
		f.Close()
		return nil, ObjectAttrs{}, fmt.Errorf("get %s: %w", key, err)
	}
	return &ctxReadCloser{ctxReader: ctxReader{ctx: ctx, r: f}, c: f}, s.attrs(key, path, fi), nil
}

// Stat implements ObjectStore.
func (s *LocalStore) Stat(ctx context.Context, key string) (ObjectAttrs, error) {
	path, err := s.Path(key)
	if err != nil {
		return ObjectAttrs{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectAttrs{}, fmt.Errorf("stat %s: %w", key, err)
	}
	fi, err := os.Lstat(path)
	if err == nil && !fi.Mode().IsRegular() {
		err = ErrNotExist
	}
	if err != nil {
		return ObjectAttrs{}, fmt.Errorf("stat %s: %w", key, notExist(err))
	}
	return s.attrs(key, path, fi), nil
}

// List implements ObjectStore.
func (s *LocalStore) List(ctx context.Context, prefix string) ([]ObjectAttrs, error) {
	base := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		dir, err := s.Path(prefix[:i])
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, err)
		}
		base = dir
	}
	var out []ObjectAttrs
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil // removed while listing, or prefix names no folder
			}
			return err
		}
		if path == s.root {
			return nil
		}
		rel, err := filepath.Rel(s.root, path)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || !(strings.HasPrefix(key+"/", prefix) || strings.HasPrefix(prefix, key+"/")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") || !d.Type().IsRegular() || !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, s.attrs(key, path, fi))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// RemoveStaleTemps removes the temporary files of Puts that never finished (a process killed
// mid-upload) in the folder of prefix, when they were last written before before. A Put in
// flight keeps writing its file, so a cutoff well in the past never removes a live one.
func (s *LocalStore) RemoveStaleTemps(ctx context.Context, prefix string, before time.Time) ([]string, error) {
	p := strings.Trim(prefix, "/")
	if p == "" {
		return nil, nil
	}
	if err := checkKey(p); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.root, filepath.FromSlash(p))
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove stale temporary files in %s: %w", prefix, err)
	}
	var removed []string
	for _, e := range entries {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		if !strings.HasPrefix(e.Name(), ".tmp-") || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(before) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove stale temporary file %s: %w", e.Name(), err)
		}
		removed = append(removed, p+"/"+e.Name())
	}
	return removed, nil
}

// Delete implements ObjectStore.
func (s *LocalStore) Delete(ctx context.Context, key string) error {
	path, err := s.Path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	fi, err := os.Lstat(path)
	if err == nil && !fi.Mode().IsRegular() {
		err = ErrNotExist
	}
	if err == nil {
		err = os.Remove(path)
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, notExist(err))
	}
	if err := os.Remove(sidecarPath(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: metadata: %w", key, err)
	}
	dir := filepath.Dir(path)
	if err := syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Remove the folders this leaves empty; Remove fails on a folder that is not empty, and a
	// Put racing with this recreates its folder (see createTemp).
	for d := dir; d != s.root && strings.HasPrefix(d, s.root+string(filepath.Separator)); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break
		}
	}
	return nil
}

// createTemp creates a temporary file in dir, creating dir (and fsyncing each new folder's
// parent) as needed. It retries when a concurrent Delete removes the folder in between.
func (s *LocalStore) createTemp(dir, pattern string) (*os.File, error) {
	for i := 0; ; i++ {
		err := s.mkdirAll(dir)
		if err == nil {
			var f *os.File
			if f, err = os.CreateTemp(dir, pattern); err == nil {
				return f, nil
			}
		}
		if !errors.Is(err, fs.ErrNotExist) || i == 9 {
			return nil, err
		}
	}
}

func (s *LocalStore) mkdirAll(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: %w", dir, errNotDir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if dir != s.root && parent != dir {
		if err := s.mkdirAll(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

var errNotDir = errors.New("not a directory")

// sidecar is the JSON of a metadata sidecar.
type sidecar struct {
	ContentType string            `json:"content_type,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	// Size and ModTimeNanos identify the data file that this sidecar describes.
	Size         int64 `json:"size"`
	ModTimeNanos int64 `json:"mod_time_ns"`
}

func sidecarPath(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".meta.json")
}

// writeSidecar publishes the sidecar of the data file at path (fi) or, when the object has
// no metadata, removes a sidecar left from an earlier version.
func (s *LocalStore) writeSidecar(path string, fi fs.FileInfo, opts PutOptions) error {
	sc := sidecarPath(path)
	if opts.ContentType == "" && len(opts.Metadata) == 0 {
		if err := os.Remove(sc); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(sidecar{ContentType: opts.ContentType, Metadata: opts.Metadata,
		Size: fi.Size(), ModTimeNanos: fi.ModTime().UnixNano()})
	if err != nil {
		return err
	}
	f, err := s.createTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), sc)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// attrs builds the attributes of the data file at path, with its sidecar if that matches.
func (s *LocalStore) attrs(key, path string, fi fs.FileInfo) ObjectAttrs {
	a := ObjectAttrs{Key: key, Size: fi.Size(), Created: fi.ModTime()}
	f, err := os.Open(sidecarPath(path))
	if err != nil {
		return a
	}
	defer f.Close()
	var sc sidecar
	if json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&sc) != nil ||
		sc.Size != fi.Size() || sc.ModTimeNanos != fi.ModTime().UnixNano() {
		return a
	}
	a.ContentType, a.Metadata = sc.ContentType, sc.Metadata
	return a
}

// checkKey enforces LocalStore's key rules.
func checkKey(key string) error {
	if key == "" || len(key) > 1024 || !utf8.ValidString(key) || strings.ContainsRune(key, 0) {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if seg == "" || seg[0] == '.' || strings.ContainsRune(seg, filepath.Separator) {
			return fmt.Errorf("%w: %q", ErrInvalidKey, key)
		}
	}
	return nil
}

// notExist maps a missing file (or a path through a file) to ErrNotExist.
func notExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return ErrNotExist
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func copyMetadata(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
