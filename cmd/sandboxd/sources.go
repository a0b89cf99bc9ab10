package main

import (
	"context"
	"errors"
	"io"
	"iter"
	"sync"

	"sandboxd/internal/source"
)

// lazyGCS is the object lister of source.gcs_prefix creates. It makes its GCS client
// (application-default credentials, or STORAGE_EMULATOR_HOST's emulator) on first use, so a
// server whose projects never bootstrap from GCS needs no credentials; a failure to make it is
// that call's error (the create answers UNAVAILABLE) and the next call tries again.
type lazyGCS struct {
	mu     sync.Mutex
	lister *source.GCSLister // nil until first use
	closed bool
}

var _ source.ObjectLister = (*lazyGCS)(nil)

func (l *lazyGCS) get(ctx context.Context) (*source.GCSLister, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errLazyClosed
	}
	if l.lister == nil {
		// The client outlives the request that made it.
		g, err := source.NewGCSLister(context.WithoutCancel(ctx), nil)
		if err != nil {
			return nil, err
		}
		l.lister = g
	}
	return l.lister, nil
}

var errLazyClosed = errors.New("gcs source lister: closed")

// Objects implements source.ObjectLister.
func (l *lazyGCS) Objects(ctx context.Context, bucket, prefix string) iter.Seq2[source.Object, error] {
	g, err := l.get(ctx)
	if err != nil {
		return func(yield func(source.Object, error) bool) { yield(source.Object{}, err) }
	}
	return g.Objects(ctx, bucket, prefix)
}

// Open implements source.ObjectLister.
func (l *lazyGCS) Open(ctx context.Context, bucket, name string, generation int64) (io.ReadCloser, error) {
	g, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return g.Open(ctx, bucket, name, generation)
}

// Close closes the client if one was made.
func (l *lazyGCS) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.lister == nil {
		return nil
	}
	return l.lister.Close()
}
