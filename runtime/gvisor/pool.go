package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"sandboxd/runtime"
)

// Warm pools (runtime.Pooler). A box of a pool is an ordinary box of this driver (its folder,
// disk, container and runsc id are the box id, minted as a sandbox id when the box is made)
// whose record names the pool (Record.Pool): Get, List and UpdateRecord leave it out, so
// nothing that works on sandboxes sees it. A claim is an UpdatePool that clears Pool, made
// under the box's record mutex and the flock of its lock file, so that of two claims (two
// processes sharing the state folder included) one finds the box still pooled and the other
// finds it gone. Nothing about the box changes at a claim: it keeps its id, its disk and its
// container, so a claim costs one record write.

var _ runtime.Pooler = (*Driver)(nil)

// ListPool implements runtime.Pooler.
func (d *Driver) ListPool(ctx context.Context) ([]runtime.Box, error) {
	entries, err := os.ReadDir(d.boxes.dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: list boxes: %w", err)
	}
	var boxes []runtime.Box
	for _, e := range entries {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		b, err := d.get(ctx, e.Name())
		if errors.Is(err, runtime.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if b.Record.Pool != "" {
			boxes = append(boxes, b)
		}
	}
	return boxes, nil
}

// UpdatePool implements runtime.Pooler.
func (d *Driver) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	if err := checkID(id); err != nil {
		return runtime.Record{}, err
	}
	return d.boxes.updateStored(ctx, id, func(rec *runtime.Record) (bool, error) {
		if rec.Pool == "" {
			return false, fmt.Errorf("gvisor: box %s is not in a warm pool: %w", id, runtime.ErrNotFound)
		}
		return true, fn(rec)
	})
}

// get is Get for boxes of pools too.
func (d *Driver) get(ctx context.Context, id string) (runtime.Box, error) {
	st, err := d.boxes.readStored(id)
	if err != nil {
		return runtime.Box{}, err
	}
	phase, reason, err := d.observe(ctx, id)
	if err != nil {
		return runtime.Box{}, err
	}
	return runtime.Box{Record: st.Record, Phase: phase, Reason: reason, Fence: st.Fence}, nil
}

// errPooled is what the sandbox verbs answer for a box of a pool: it is no sandbox.
func errPooled(id string) error {
	return fmt.Errorf("gvisor: box %s is in a warm pool: %w", id, runtime.ErrNotFound)
}
