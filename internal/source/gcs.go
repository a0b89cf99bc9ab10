package source

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"

	"sandboxd/internal/apierror"
)

// Object is one object of a listing.
type Object struct {
	Name       string // the full object name
	Size       int64
	Generation int64 // read exactly this generation (0: the live one)
	Updated    time.Time
}

// ObjectLister lists and reads the objects of a bucket; GCSLister is the one over Google Cloud
// Storage. Errors wrap ErrBucketNotExist and ErrObjectNotExist where they apply.
type ObjectLister interface {
	// Objects yields the objects whose names start with prefix, in lexical order; after an
	// error it yields nothing more.
	Objects(ctx context.Context, bucket, prefix string) iter.Seq2[Object, error]
	// Open reads one generation of an object.
	Open(ctx context.Context, bucket, name string, generation int64) (io.ReadCloser, error)
}

var (
	// ErrBucketNotExist is (wrapped in) the error of a listing of a bucket that does not exist.
	ErrBucketNotExist = errors.New("bucket does not exist")
	// ErrObjectNotExist is (wrapped in) the error of opening an object that does not exist.
	ErrObjectNotExist = errors.New("object does not exist")
)

const nounObject = "object"

// ParseGCSPrefix parses "gs://bucket/some/prefix/" into the bucket and the prefix, which is
// a folder: "" for the whole bucket, otherwise ending in "/" (added when missing). A prefix
// with an empty, "." or ".." segment, a control character or invalid UTF-8 is refused.
func ParseGCSPrefix(s string) (bucket, prefix string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", apierror.New(apierror.InvalidArgument, "GCS prefix %q %s", s, why)
	}
	rest, ok := strings.CutPrefix(s, "gs://")
	if !ok {
		return bad("does not start with gs://")
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if !validBucket(bucket) {
		return bad("does not name a valid bucket")
	}
	if prefix == "" {
		return bucket, "", nil
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	if len(prefix) > 1024 || !utf8.ValidString(prefix) {
		return bad("is not a valid object name prefix")
	}
	for _, r := range prefix {
		if r < 0x20 || r == 0x7f {
			return bad("holds a control character")
		}
	}
	for seg := range strings.SplitSeq(strings.TrimSuffix(prefix, "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad(`has an empty, "." or ".." segment`)
		}
	}
	return bucket, prefix, nil
}

// validBucket: GCS bucket naming (3 to 222 characters of a-z, 0-9, -, _ and ., beginning and
// ending with a letter or digit).
func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 222 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || i == len(b)-1 || (c != '-' && c != '_' && c != '.')) {
			return false
		}
	}
	return true
}

// PrefixPermitted reports whether the prefix bucketPrefix lies inside one of allowed (each
// "gs://bucket/" or "gs://bucket/prefix/"), on whole path segments: gs://b/tasks/ permits
// gs://b/tasks/ and gs://b/tasks/x/, never gs://b/tasks-evil/. Entries of allowed that do
// not parse permit nothing.
func PrefixPermitted(allowed []string, bucketPrefix string) bool {
	bucket, prefix, err := ParseGCSPrefix(bucketPrefix)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(allowed, func(a string) bool {
		ab, ap, err := ParseGCSPrefix(a)
		return err == nil && ab == bucket && strings.HasPrefix(prefix, ap)
	})
}

// gcsItem is an object, checked: the headers to write and, for a file with content, the
// object to copy.
type gcsItem struct {
	hdrs []*tar.Header
	obj  Object
	copy bool
}

// GCSPrefix returns the objects under bucketPrefix ("gs://bucket/prefix/") as a normalized
// tar stream: each object's name relative to the prefix is its path ("a/" objects, folder
// placeholders, are directories), under the same rules and limits as an archive (read in
// lexical order, so "x" before "x/y" is refused as a file with something below it). The
// prefix must lie inside one of allowed (PrefixPermitted). The whole listing is checked
// before the stream starts; each object is read at the generation the listing saw.
func (f *Fetcher) GCSPrefix(ctx context.Context, bucketPrefix string, allowed []string, objects ObjectLister) (io.ReadCloser, error) {
	bucket, prefix, err := ParseGCSPrefix(bucketPrefix)
	if err != nil {
		return nil, err
	}
	where := "gs://" + bucket + "/" + prefix
	if !PrefixPermitted(allowed, bucketPrefix) {
		return nil, apierror.New(apierror.InvalidArgument, "GCS prefix %q is not a source this project may use", where)
	}
	if objects == nil {
		return nil, errors.New("source: no object lister")
	}
	j := f.newJob(ctx, "")
	started := false
	defer func() {
		if !started {
			j.release()
		}
	}()
	t := f.newTree(nounObject)
	var items []gcsItem
	for obj, err := range objects.Objects(j.ictx, bucket, prefix) {
		if err != nil {
			return nil, j.gcsFail(err, "", "listing "+where)
		}
		rel, ok := strings.CutPrefix(obj.Name, prefix)
		if !ok || rel == "" {
			continue // the folder placeholder of the prefix itself
		}
		e := entry{name: rel, kind: tar.TypeReg, size: obj.Size, mode: 0o644, mtime: obj.Updated}
		if strings.HasSuffix(rel, "/") {
			e.kind, e.size, e.mode = tar.TypeDir, 0, 0o755
		}
		hdrs, err := t.add(e, obj.Name)
		if err != nil {
			return nil, err
		}
		items = append(items, gcsItem{hdrs: hdrs, obj: obj, copy: e.size > 0})
	}
	if len(items) == 0 {
		return nil, apierror.New(apierror.InvalidArgument, "there are no objects under %q", where)
	}
	started = true
	return j.start(func(tw *tar.Writer) error {
		buf := make([]byte, 128<<10)
		for _, it := range items {
			for _, h := range it.hdrs {
				if err := tw.WriteHeader(h); err != nil {
					return j.gcsFail(err, it.obj.Name, "writing")
				}
			}
			if !it.copy {
				continue
			}
			if err := j.copyObject(tw, objects, bucket, it.obj, buf); err != nil {
				return err
			}
		}
		return nil
	}), nil
}

// copyObject copies exactly the listed size of one object.
func (j *job) copyObject(w io.Writer, objects ObjectLister, bucket string, o Object, buf []byte) error {
	rc, err := objects.Open(j.ictx, bucket, o.Name, o.Generation)
	if err != nil {
		return j.gcsFail(err, o.Name, "opening")
	}
	defer rc.Close()
	n, err := io.CopyBuffer(w, io.LimitReader(rc, o.Size), buf)
	if err == nil && n < o.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		var one [1]byte
		if m, rerr := io.ReadFull(rc, one[:]); m > 0 {
			err = errors.New("object longer than listed")
		} else if rerr != io.EOF {
			err = rerr
		}
	}
	if err != nil {
		return j.gcsFail(err, o.Name, "reading")
	}
	return nil
}

// gcsFail classifies an error of listing or reading objects.
func (j *job) gcsFail(err error, name, doing string) error {
	if e := (*apierror.Error)(nil); errors.As(err, &e) {
		return e
	}
	if j.out != nil && j.out.err != nil {
		return j.out.err
	}
	if j.ctx.Err() != nil {
		return j.ctx.Err()
	}
	if cerr := j.f.causeError(j.ictx); cerr != nil {
		return cerr
	}
	switch {
	case errors.Is(err, ErrBucketNotExist):
		return apierror.Wrap(err, apierror.InvalidArgument, "%s: the bucket does not exist", doing)
	case name == "":
		return j.f.unavailable(err, 0, "%s failed", doing)
	case errors.Is(err, ErrObjectNotExist):
		return j.f.unavailable(err, 0, "object %q changed while it was fetched", name).WithDetail("entry", name)
	}
	return j.f.unavailable(err, 0, "%s the object %q failed", doing, name).WithDetail("entry", name)
}

// GCSLister is an ObjectLister over Google Cloud Storage.
type GCSLister struct {
	client *storage.Client
	owned  bool
}

var _ ObjectLister = (*GCSLister)(nil)

// NewGCSLister returns a GCSLister over client. When client is nil it makes one with the
// application-default credentials (or, when STORAGE_EMULATOR_HOST is set, without
// credentials against that emulator), as internal/checkpoint does, and Close closes it.
func NewGCSLister(ctx context.Context, client *storage.Client) (*GCSLister, error) {
	if client != nil {
		return &GCSLister{client: client}, nil
	}
	c, err := storage.NewClient(ctx, storage.WithJSONReads())
	if err != nil {
		return nil, fmt.Errorf("source: gcs client: %w", err)
	}
	return &GCSLister{client: c, owned: true}, nil
}

// Close closes the storage client if NewGCSLister made it.
func (l *GCSLister) Close() error {
	if !l.owned {
		return nil
	}
	return l.client.Close()
}

// Objects implements ObjectLister.
func (l *GCSLister) Objects(ctx context.Context, bucket, prefix string) iter.Seq2[Object, error] {
	return func(yield func(Object, error) bool) {
		q := &storage.Query{Prefix: prefix, Projection: storage.ProjectionNoACL}
		if err := q.SetAttrSelection([]string{"Name", "Size", "Generation", "Updated"}); err != nil {
			yield(Object{}, err)
			return
		}
		it := l.client.Bucket(bucket).Objects(ctx, q)
		for {
			a, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return
			}
			if err != nil {
				yield(Object{}, gcsNotExist(err, ErrBucketNotExist))
				return
			}
			if !yield(Object{Name: a.Name, Size: a.Size, Generation: a.Generation, Updated: a.Updated}, nil) {
				return
			}
		}
	}
}

// Open implements ObjectLister.
func (l *GCSLister) Open(ctx context.Context, bucket, name string, generation int64) (io.ReadCloser, error) {
	o := l.client.Bucket(bucket).Object(name)
	if generation > 0 {
		o = o.Generation(generation)
	}
	rc, err := o.NewReader(ctx)
	if err != nil {
		return nil, gcsNotExist(err, ErrObjectNotExist)
	}
	return rc, nil
}

// gcsNotExist wraps a "does not exist" answer of GCS with sentinel.
func gcsNotExist(err, sentinel error) error {
	var gerr *googleapi.Error
	if errors.Is(err, storage.ErrBucketNotExist) || errors.Is(err, storage.ErrObjectNotExist) ||
		(errors.As(err, &gerr) && gerr.Code == http.StatusNotFound) {
		return fmt.Errorf("%w: %w", sentinel, err)
	}
	return err
}
