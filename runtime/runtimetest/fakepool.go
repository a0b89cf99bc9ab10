package runtimetest

import (
	"context"

	"sandboxd/runtime"
)

// The Fake's warm pools (runtime.Pooler): a box whose record names a pool is left out of Get,
// List and UpdateRecord, as the local driver does, until an UpdatePool clears its Pool.

var _ runtime.Pooler = (*Fake)(nil)

// ListPool implements runtime.Pooler, in id order.
func (f *Fake) ListPool(ctx context.Context) ([]runtime.Box, error) {
	return f.listBoxes("ListPool", true)
}

// UpdatePool implements runtime.Pooler. fn runs under the Fake's lock: it must not call the
// Fake.
func (f *Fake) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	return f.updateBox(ctx, "UpdatePool", id, true, fn)
}
