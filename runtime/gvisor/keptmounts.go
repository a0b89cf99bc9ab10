package gvisor

import (
	"context"
	"os"
	"slices"
	"sync"
)

// DefaultKeptMounts is how many stopped boxes keep their disk mounted by default
// (Options.KeptMounts).
const DefaultKeptMounts = 32

// keptMounts holds the stopped boxes whose disks a stop left mounted, oldest first. A mounted
// disk keeps its page cache: the box's next start does not mount it, and the stop after that
// reads the workspace for its checkpoint from memory instead of through the loop device, file
// by file (on a 100 MB, 6,000-file workspace: 185 ms of reads cold against 70 ms warm). The
// kernel still reclaims that cache under memory pressure; what is bounded here is the mounts
// and loop devices of boxes nobody uses, at most max of them. The oldest beyond are unmounted
// in the background, each under its box's lock and only while its box is still stopped.
type keptMounts struct {
	max int
	mu  sync.Mutex
	ids []string // oldest first
	// evicting are the ids taken off ids to be unmounted: a start, a delete or another
	// stop of one takes it back (forget or keep), and then the unmount is skipped.
	evicting map[string]bool
	wg       sync.WaitGroup
}

// keep records a box stopped with its disk mounted and returns the ids over the bound, which
// the caller unmounts (unmountKept). A max of 0 keeps none: id itself is returned.
func (k *keptMounts) keep(id string) (evict []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ids = slices.DeleteFunc(k.ids, func(s string) bool { return s == id })
	delete(k.evicting, id)
	k.ids = append(k.ids, id)
	if over := len(k.ids) - k.max; over > 0 {
		evict = slices.Clone(k.ids[:over])
		k.ids = slices.Delete(k.ids, 0, over)
		if k.evicting == nil {
			k.evicting = make(map[string]bool)
		}
		for _, e := range evict {
			k.evicting[e] = true
		}
	}
	return evict
}

// forget takes a box off the kept disks: it is starting, resuming or being deleted, all
// under its lock. It reports whether the box was kept.
func (k *keptMounts) forget(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.ids)
	k.ids = slices.DeleteFunc(k.ids, func(s string) bool { return s == id })
	was := len(k.ids) < n || k.evicting[id]
	delete(k.evicting, id)
	return was
}

// has reports whether id is a stopped box whose disk is kept mounted.
func (k *keptMounts) has(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Contains(k.ids, id) || k.evicting[id]
}

// claimEviction reports whether id is still to be unmounted, and takes it off.
func (k *keptMounts) claimEviction(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.evicting[id] {
		return false
	}
	delete(k.evicting, id)
	return true
}

// keepMounted records a box that Stop left with its disk mounted and unmounts, in the
// background, the disks beyond the bound.
func (d *Driver) keepMounted(id string) {
	evict := d.kept.keep(id)
	if len(evict) == 0 {
		return
	}
	d.kept.wg.Add(1)
	go func() {
		defer d.kept.wg.Done()
		for _, e := range evict {
			d.unmountKept(e)
		}
	}()
}

// takeKept takes a box that is about to run again off the kept disks (its disk, if still
// mounted, is used as it is) and unmounts a kept disk whose image was removed since, so that
// the box starts on a new one (dropStaleMount). Under the box's lock, with no container.
func (d *Driver) takeKept(id string) error {
	d.kept.forget(id)
	return d.disks.dropStaleMount(id)
}

// unmountKept unmounts the disk of a stopped box taken off the kept disks, unless it started
// (or was stopped again, or deleted) meanwhile.
func (d *Driver) unmountKept(id string) {
	unlock := d.boxMu.lock(id)
	defer unlock()
	if !d.kept.claimEviction(id) {
		return
	}
	if _, err := os.Stat(d.boxes.boxDir(id)); err != nil {
		return
	}
	if err := d.disks.unmountDisk(id); err != nil {
		d.log.Warn("unmounting the disk of a stopped box", "box", id, "err", err)
		return
	}
	d.log.Debug("unmounted the disk of a stopped box", "box", id)
}

// adoptKeptMounts finds, when the driver starts, the boxes whose container is gone but whose
// disk is still mounted (an earlier server stopped them) and keeps them as stopped: the
// bound holds across restarts.
func (d *Driver) adoptKeptMounts() {
	entries, err := os.ReadDir(d.boxes.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !ValidID(id) {
			continue
		}
		unlock := d.boxMu.lock(id)
		_, exists, err := d.readState(context.Background(), id)
		mounted := false
		if err == nil && !exists {
			// A disk whose image is gone is unmounted now; the box starts fresh.
			if err = d.disks.dropStaleMount(id); err == nil {
				mounted, err = d.disks.diskMounted(id)
			}
		}
		unlock()
		if err == nil && mounted && !exists {
			d.keepMounted(id)
		}
	}
}
