package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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
//
// The pool index (StateDir/pool/<id>, an empty file per box) names the boxes that are or may
// be in a pool, so that ListPool (every claim, every pass of the pool loop) reads the records
// of the pool's boxes only, not those of every sandbox. The records stay the truth: the index
// is a superset of the pooled boxes, checked against them at every listing. Its entry is made
// before the record of a pooled box is first written (Create) and removed after the record
// stopped naming a pool (the claim's UpdatePool) or the box was deleted; a process killed in
// between leaves an entry too many, which a listing removes once it finds the box folder gone
// or its record not pooled. The index is rebuilt from the records when the driver starts (a
// state folder from before the index, or a host crash that lost an entry's creation).

var _ runtime.Pooler = (*Driver)(nil)

// poolDn is the pool index under StateDir.
const poolDn = "pool"

// poolIndex is the folder of the pool index.
type poolIndex struct{ dir string }

// add makes id's entry. It is not synced: a lost entry is made again by the rebuild at start.
func (x poolIndex) add(id string) error {
	f, err := os.OpenFile(filepath.Join(x.dir, id), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("gvisor: pool index: %w", err)
	}
	return f.Close()
}

// remove drops id's entry (none is fine).
func (x poolIndex) remove(id string) {
	_ = os.Remove(filepath.Join(x.dir, id))
}

// ids lists the entries that are box ids (anything else in the folder is ignored).
func (x poolIndex) ids() ([]string, error) {
	entries, err := os.ReadDir(x.dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: pool index: %w", err)
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Type().IsRegular() && ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// rebuildPoolIndex makes the index's folder and an entry for every box whose record names a
// pool (New: the records are the truth).
func (d *Driver) rebuildPoolIndex() error {
	if err := os.MkdirAll(d.pool.dir, 0o700); err != nil {
		return fmt.Errorf("gvisor: pool index: %w", err)
	}
	entries, err := os.ReadDir(d.boxes.dir)
	if err != nil {
		return fmt.Errorf("gvisor: list boxes: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		if rec, err := d.boxes.readRecord(e.Name()); err == nil && rec.Pool != "" {
			if err := d.pool.add(rec.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// ListPool implements runtime.Pooler: the boxes the pool index names whose records name a
// pool. Entries of boxes that are gone or no longer pooled are removed on the way.
func (d *Driver) ListPool(ctx context.Context) ([]runtime.Box, error) {
	ids, err := d.pool.ids()
	if err != nil {
		return nil, err
	}
	var boxes []runtime.Box
	for _, id := range ids {
		b, err := d.get(ctx, id)
		if errors.Is(err, runtime.ErrNotFound) {
			if _, serr := os.Lstat(d.boxes.boxDir(id)); errors.Is(serr, fs.ErrNotExist) {
				d.pool.remove(id) // the box is gone
			}
			// Else its create is writing the record (or was interrupted: its folder is
			// cleaned up with the box).
			continue
		}
		if err != nil {
			return nil, err
		}
		if b.Record.Pool == "" {
			d.pool.remove(id) // claimed by a process that died before it removed the entry
			continue
		}
		boxes = append(boxes, b)
	}
	return boxes, nil
}

// UpdatePool implements runtime.Pooler. The record is written only when fn changed it (or
// the write's fence rose), atomically but not synced: a pool box does not outlive a host
// crash, and a claim is made durable by the sandbox's next UpdateRecord (RUNNING), which is
// synced; a claim a host crash lost leaves a dead pool box, which the pool loop retires.
func (d *Driver) UpdatePool(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	if err := checkID(id); err != nil {
		return runtime.Record{}, err
	}
	rec, err := d.boxes.updateStoredSync(ctx, id, false, func(rec *runtime.Record) (bool, error) {
		if rec.Pool == "" {
			return false, fmt.Errorf("gvisor: box %s is not in a warm pool: %w", id, runtime.ErrNotFound)
		}
		// A look that changes nothing (a claim's check under its lock) writes nothing: no
		// fsync on the claim's path for it.
		before, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		if err := fn(rec); err != nil {
			return false, err
		}
		after, err := json.Marshal(rec)
		return !bytes.Equal(before, after), err
	})
	if err == nil && rec.Pool == "" {
		d.pool.remove(id) // claimed: out of the index
	}
	return rec, err
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
