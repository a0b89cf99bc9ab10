package checkpoint

import (
	"context"
	"errors"
	"io"
	"time"
)

// ObjectStore is the small, GCS-shaped blob store that checkpoints are written to. Keys are
// slash-separated names; there are no folders, only prefixes. LocalStore is the embedded
// implementation; storetest.Run is the conformance suite every implementation passes.
type ObjectStore interface {
	// Put streams r to key. The object becomes visible only when r is fully read and stored:
	// a Put that fails (r returns an error, ctx is cancelled) leaves no object at key, and an
	// existing object is replaced whole or not at all. With opts.IfNotExists a Put to an
	// existing key fails with an error wrapping ErrPrecondition.
	Put(ctx context.Context, key string, r io.Reader, opts PutOptions) (ObjectAttrs, error)
	// Get opens key for reading. The caller closes the reader. A missing key is ErrNotExist.
	Get(ctx context.Context, key string) (io.ReadCloser, ObjectAttrs, error)
	// Stat returns the attributes of key. A missing key is ErrNotExist.
	Stat(ctx context.Context, key string) (ObjectAttrs, error)
	// List returns every object whose key starts with prefix (a plain string prefix, no
	// delimiter), sorted by key. No match is an empty list, not an error.
	List(ctx context.Context, prefix string) ([]ObjectAttrs, error)
	// Delete removes key. A missing key is ErrNotExist.
	Delete(ctx context.Context, key string) error
}

// PutOptions are the options of ObjectStore.Put.
type PutOptions struct {
	// IfNotExists makes the Put fail with ErrPrecondition when key already exists
	// (GCS: ifGenerationMatch=0).
	IfNotExists bool
	// ContentType is stored with the object ("" for none).
	ContentType string
	// Metadata is stored with the object (custom metadata in GCS).
	Metadata map[string]string
}

// ObjectAttrs describes a stored object.
type ObjectAttrs struct {
	Key         string
	Size        int64
	ContentType string
	Metadata    map[string]string
	// Created is when this version of the object was written.
	Created time.Time
}

// Errors of ObjectStore implementations; match them with errors.Is.
var (
	// ErrNotExist means that the key holds no object.
	ErrNotExist = errors.New("object does not exist")
	// ErrPrecondition means that a conditional Put found an existing object.
	ErrPrecondition = errors.New("object precondition failed")
)
