package runtimetest

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"sandboxd/runtime"
)

// The Fake's warm pools (runtime.Pooler): a box whose record names a pool is left out of Get,
// List and UpdateRecord, as the local driver does, until an UpdatePool clears its Pool.

var _ runtime.Pooler = (*Fake)(nil)

// ListPool implements runtime.Pooler, in id order.
func (f *Fake) ListPool(ctx context.Context) ([]runtime.Box, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("ListPool"); err != nil {
		return nil, err
	}
	var boxes []runtime.Box
	for _, id := range slices.Sorted(maps.Keys(f.boxes)) {
		b := f.boxes[id]
		if b.rec.Pool != "" {
			boxes = append(boxes, runtime.Box{Record: cloneRecord(b.rec), Phase: b.phase, Reason: b.reason, Lost: b.lost, Fence: b.fence})
		}
	}
	return boxes, nil
}

// UpdatePool implements runtime.Pooler. fn runs under the Fake's lock: it must not call the
// Fake.
func (f *Fake) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("UpdatePool"); err != nil {
		return runtime.Record{}, err
	}
	b, ok := f.boxes[id]
	if !ok || b.rec.Pool == "" {
		return runtime.Record{}, fmt.Errorf("fake: box %s is not in a warm pool: %w", id, runtime.ErrNotFound)
	}
	fence, _, err := runtime.AdmitFence(ctx, b.fence)
	if err != nil {
		return runtime.Record{}, fmt.Errorf("fake: box %s: %w", id, err)
	}
	rec := cloneRecord(b.rec)
	if err := fn(&rec); err != nil {
		return runtime.Record{}, err
	}
	if rec.ID != id {
		return runtime.Record{}, fmt.Errorf("fake: UpdatePool may not change the id (%s to %s)", id, rec.ID)
	}
	b.rec, b.fence = cloneRecord(rec), fence
	return rec, nil
}
