package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The pool of formatted disk images. mkfs.ext4 is most of what a box's disk adds to a create
// (about 8 of 10 ms, mostly starting the program), so the driver keeps one formatted image of
// each recently used size ready in StateDir/disk-pool, and a create takes it with a rename; a
// background refill then formats the next one. An image in the pool is complete (it is
// formatted under a temporary name and renamed in), never used by a box, and only the
// driver's own: nothing of a box ever reaches the pool. Another process on the same StateDir
// may take the same image: the rename decides, the loser takes the next or formats one.
type diskPool struct {
	dir string

	// ctx ends with close: refills stop.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	filling map[int64]bool // sizes being refilled
	closed  bool
	wg      sync.WaitGroup
}

const (
	diskPoolDn = "disk-pool"
	// poolMaxImages bounds the pool (the newest sizes are kept): each image costs a few MB.
	poolMaxImages = 4
	poolImageExt  = ".img"
)

func newDiskPool(stateDir string) (*diskPool, error) {
	p := &diskPool{dir: filepath.Join(stateDir, diskPoolDn), filling: map[int64]bool{}}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, err
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	// A refill cut short by a crash leaves a temporary file: never a pool image.
	if names, err := filepath.Glob(filepath.Join(p.dir, "*.new")); err == nil {
		for _, n := range names {
			_ = os.Remove(n)
		}
	}
	return p, nil
}

// take moves a formatted image of size bytes to img and reports whether there was one.
func (p *diskPool) take(img string, size int64) bool {
	for _, name := range p.images(size) {
		if err := os.Rename(filepath.Join(p.dir, name), img); err == nil {
			return true
		}
	}
	return false
}

// images lists the pool's complete images of size bytes ("<size>.<random>.img").
func (p *diskPool) images(size int64) []string {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil
	}
	prefix := strconv.FormatInt(size, 10) + "."
	var out []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, prefix) && strings.HasSuffix(n, poolImageExt) {
			out = append(out, n)
		}
	}
	return out
}

// refill formats one image of size bytes for the pool in the background, unless the pool has
// one or a refill of that size runs already. Close ends it.
func (d *disks) refillDiskPool(size int64) {
	p := d.pool
	p.mu.Lock()
	if p.closed || p.filling[size] || len(p.images(size)) > 0 {
		p.mu.Unlock()
		return
	}
	p.filling[size] = true
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.filling, size)
			p.mu.Unlock()
		}()
		var rnd [8]byte
		_, _ = rand.Read(rnd[:])
		img := filepath.Join(p.dir, strconv.FormatInt(size, 10)+"."+hex.EncodeToString(rnd[:])+poolImageExt)
		if err := d.formatImage(p.ctx, img, size, true); err != nil {
			d.log.Debug("refilling the disk pool", "bytes", size, "err", err)
			return
		}
		p.trim()
	}()
}

// trim removes the oldest images beyond poolMaxImages.
func (p *diskPool) trim() {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return
	}
	type img struct {
		name string
		mod  time.Time
	}
	var imgs []img
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), poolImageExt) {
			continue
		}
		if fi, err := e.Info(); err == nil {
			imgs = append(imgs, img{e.Name(), fi.ModTime()})
		}
	}
	if len(imgs) <= poolMaxImages {
		return
	}
	slices.SortFunc(imgs, func(a, b img) int { return a.mod.Compare(b.mod) })
	for _, i := range imgs[:len(imgs)-poolMaxImages] {
		_ = os.Remove(filepath.Join(p.dir, i.name))
	}
}

// close ends the refills and waits for them; formatted images stay for the next driver.
func (p *diskPool) close() {
	p.mu.Lock()
	p.closed = true
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
}
