package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultGCSChunkSize is the upload chunk size of GCSStore when GCSOptions.ChunkSize is 0.
const DefaultGCSChunkSize = 16 << 20

// GCSOptions configure a GCSStore.
type GCSOptions struct {
	// Bucket is the bucket that holds the objects (required).
	Bucket string
	// Prefix is prepended to every key, joined with "/" ("" for none; slashes around it are
	// ignored).
	Prefix string
	// Client is the storage client to use. When nil, NewGCSStore makes one with the
	// application-default credentials (or, when STORAGE_EMULATOR_HOST is set, without
	// credentials against that emulator) and GCSStore.Close closes it.
	Client *storage.Client
	// ChunkSize is the size of the chunks of a resumable upload, rounded up to a multiple of
	// 256 KiB (default DefaultGCSChunkSize). Each Put holds one chunk in memory; a Put of a
	// reader with a known, smaller length (bytes.Reader, strings.Reader, bytes.Buffer) uses a
	// buffer of that size instead.
	ChunkSize int
}

// GCSStore is an ObjectStore over a Google Cloud Storage bucket.
//
// The object "a/b/c" is the GCS object "{prefix}/a/b/c". A key must be non-empty valid
// UTF-8 without carriage returns or line feeds, and the object name at most 1024 bytes;
// other keys are refused with ErrInvalidKey.
//
// Put streams its reader to a resumable upload, ChunkSize bytes per request (smaller objects
// go in one request); GCS publishes the object only when the upload is finalized, so a Put
// whose reader fails or whose ctx ends abandons the upload and leaves no object (GCS expires
// the abandoned upload session after a week). IfNotExists is the precondition
// ifGenerationMatch=0. Get reads the generation whose attributes it returns, so the data and
// attributes always belong together even when the object is replaced meanwhile.
//
// The storage client retries failed requests of idempotent operations, and a conditional Put
// counts as one: when a small Put's request succeeds but its response is lost, the retry finds
// the object and fails with ErrPrecondition although the object is this Put's.
type GCSStore struct {
	client    *storage.Client
	owned     bool
	bucket    *storage.BucketHandle
	name      string // of the bucket
	prefix    string // "" or ending in "/"
	chunkSize int
}

var _ ObjectStore = (*GCSStore)(nil)

// NewGCSStore returns a GCSStore. It makes no request: a missing bucket or missing
// permissions show up on the first operation.
func NewGCSStore(ctx context.Context, opts GCSOptions) (*GCSStore, error) {
	if opts.Bucket == "" {
		return nil, errors.New("gcs store: no bucket")
	}
	if opts.ChunkSize < 0 {
		return nil, fmt.Errorf("gcs store: chunk size %d < 0", opts.ChunkSize)
	}
	s := &GCSStore{client: opts.Client, name: opts.Bucket, chunkSize: opts.ChunkSize}
	if s.chunkSize == 0 {
		s.chunkSize = DefaultGCSChunkSize
	}
	if p := strings.Trim(opts.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	if s.client == nil {
		// NewClient reads STORAGE_EMULATOR_HOST itself: when it is set, the client talks to
		// http://$STORAGE_EMULATOR_HOST/storage/v1/ without credentials.
		c, err := storage.NewClient(ctx, storage.WithJSONReads())
		if err != nil {
			return nil, fmt.Errorf("gcs store: %w", err)
		}
		s.client, s.owned = c, true
	}
	s.bucket = s.client.Bucket(opts.Bucket)
	return s, nil
}

// Bucket is the name of the bucket.
func (s *GCSStore) Bucket() string { return s.name }

// Close closes the storage client if NewGCSStore made it.
func (s *GCSStore) Close() error {
	if !s.owned {
		return nil
	}
	return s.client.Close()
}

// objectName is the object name of key.
func (s *GCSStore) objectName(key string) (string, error) {
	name := s.prefix + key
	if key == "" || len(name) > 1024 || !utf8.ValidString(key) || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	return name, nil
}

// Put implements ObjectStore.
func (s *GCSStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectAttrs, error) {
	name, err := s.objectName(key)
	if err != nil {
		return ObjectAttrs{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	// Cancelling wctx before Close abandons the upload: the storage client then ends the
	// request stream with an error instead of finalizing the object (and a request made
	// after the cancellation fails at once).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	o := s.bucket.Object(name)
	if opts.IfNotExists {
		o = o.If(storage.Conditions{DoesNotExist: true})
	}
	w := o.NewWriter(wctx)
	w.ChunkSize = s.chunkSize
	if l, ok := r.(interface{ Len() int }); ok && l.Len() < s.chunkSize {
		w.ChunkSize = l.Len() + 1 // one request, with a buffer no larger than needed
	}
	w.ContentType = opts.ContentType
	w.ForceEmptyContentType = opts.ContentType == "" // no sniffing: "" means none
	w.Metadata = copyMetadata(opts.Metadata)

	// ctxReader: stop reading once ctx ends. The struct hides a WriterTo of r, so that
	// CopyBuffer writes in pieces of buf and ctxReader sees every read.
	_, err = io.CopyBuffer(w, ctxReader{ctx: ctx, r: r}, make([]byte, 256<<10))
	if err == nil {
		err = ctx.Err() // the last read may have raced with a cancellation
	}
	if err != nil {
		cancel()
		w.Close() // waits for the upload to end; it fails with the cancellation
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := w.Close(); err != nil {
		if isPrecondition(err) {
			return ObjectAttrs{}, fmt.Errorf("put %s: %w: %w", key, ErrPrecondition, err)
		}
		return ObjectAttrs{}, fmt.Errorf("put %s: %w", key, err)
	}
	return s.attrs(key, w.Attrs()), nil
}

// Get implements ObjectStore. Reads fail once ctx is done.
func (s *GCSStore) Get(ctx context.Context, key string) (io.ReadCloser, ObjectAttrs, error) {
	name, err := s.objectName(key)
	if err != nil {
		return nil, ObjectAttrs{}, err
	}
	o := s.bucket.Object(name)
	for attempt := 1; ; attempt++ {
		// The reader has no custom metadata on JSON reads: take the attributes first and read
		// that generation.
		a, err := o.Attrs(ctx)
		if err != nil {
			return nil, ObjectAttrs{}, fmt.Errorf("get %s: %w", key, notExistGCS(err))
		}
		rc, err := o.Generation(a.Generation).NewReader(ctx)
		if errors.Is(err, storage.ErrObjectNotExist) && attempt < 3 {
			continue // replaced or deleted since Attrs
		}
		if err != nil {
			return nil, ObjectAttrs{}, fmt.Errorf("get %s: %w", key, notExistGCS(err))
		}
		return rc, s.attrs(key, a), nil
	}
}

// Stat implements ObjectStore.
func (s *GCSStore) Stat(ctx context.Context, key string) (ObjectAttrs, error) {
	name, err := s.objectName(key)
	if err != nil {
		return ObjectAttrs{}, err
	}
	a, err := s.bucket.Object(name).Attrs(ctx)
	if err != nil {
		return ObjectAttrs{}, fmt.Errorf("stat %s: %w", key, notExistGCS(err))
	}
	return s.attrs(key, a), nil
}

// List implements ObjectStore.
func (s *GCSStore) List(ctx context.Context, prefix string) ([]ObjectAttrs, error) {
	q := &storage.Query{Prefix: s.prefix + prefix, Projection: storage.ProjectionNoACL}
	if err := q.SetAttrSelection([]string{"Name", "Size", "ContentType", "Metadata", "Created"}); err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	it := s.bucket.Objects(ctx, q)
	var out []ObjectAttrs
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, err)
		}
		key, ok := strings.CutPrefix(a.Name, s.prefix)
		if !ok || key == "" {
			continue // not one of ours (cannot happen with this query), or the prefix itself
		}
		out = append(out, s.attrs(key, a))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete implements ObjectStore.
func (s *GCSStore) Delete(ctx context.Context, key string) error {
	name, err := s.objectName(key)
	if err != nil {
		return err
	}
	if err := s.bucket.Object(name).Delete(ctx); err != nil {
		return fmt.Errorf("delete %s: %w", key, notExistGCS(err))
	}
	return nil
}

func (s *GCSStore) attrs(key string, a *storage.ObjectAttrs) ObjectAttrs {
	return ObjectAttrs{Key: key, Size: a.Size, ContentType: a.ContentType,
		Metadata: copyMetadata(a.Metadata), Created: a.Created}
}

// notExistGCS maps a missing object to ErrNotExist.
func notExistGCS(err error) error {
	if errors.Is(err, storage.ErrObjectNotExist) {
		return ErrNotExist
	}
	return err
}

// isPrecondition reports whether err is a failed precondition: HTTP 412 from the JSON API,
// FAILED_PRECONDITION from the gRPC API.
func isPrecondition(err error) bool {
	var gerr *googleapi.Error
	if errors.As(err, &gerr) && gerr.Code == http.StatusPreconditionFailed {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.FailedPrecondition
}
