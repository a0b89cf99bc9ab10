package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// Pause and resume (runtime.Driver's Pause, MemoryImage, DropMemoryImage, Resume).
//
// A pause asks the box's guest init to close its host socket (runsc cannot save a socket bound
// on a host folder; proto/pause.go), then `runsc checkpoint` saves the box's memory and
// processes into StateDir/boxes/<id>/memory.new/ and ends the sandbox; the folder is renamed
// to memory/ once complete (checkpointer.go: the shell that runs runsc marks it so), with
// meta.json beside runsc's files (what made the image: the runsc binary's hash and the host;
// image.go). The deletion of what runsc keeps of the container
// (its processes ended with the checkpoint) starts in the background as Pause returns
// (teardown.go); Stop then releases the disk, as for a crashed box. While a pause runs, the
// file `pausing` in the box's folder makes Attach refuse: no `runsc exec` attach may start in
// the box while it is saved. MemoryImage streams the kept image as tar and writes its files'
// sums (sums.json) on the way.
//
// A resume restores from the kept image when its files still match their sums, else extracts
// the stored copy (the tar stream MemoryImage made) into memory.restore/; it checks meta.json
// against this host and runsc, mounts the disk again at the same path, writes the reopen marker
// into the host socket's folder and runs `runsc restore` of the box's last bundle (the box's
// processes go on, PID 1 with the channel key it had, so the driver keeps channel.key); the
// restored init finds the marker and listens again (with the signal only when it did not).
//
// A checkpoint that fails ends the sandbox (runsc kills a box whose save failed): the guest
// init's quiesce refuses first what it knows would fail (a socket bound in the workspace).

// Files of a paused box in its folder.
const (
	memoryDn        = "memory"
	memoryNewDn     = "memory.new"
	memoryRestoreDn = "memory.restore"
	pausingFile     = "pausing"
	imageMetaFile   = "meta.json"
	// imageSumsFile, beside a kept image's files, holds their sizes and sha256 sums, taken as
	// MemoryImage streamed them: a resume on this host restores from the kept image only when
	// its files still match.
	imageSumsFile = "sums.json"
	// imageDoneFile, an empty file among an image's files, is the checkpoint's shell's mark
	// that runsc saved the box completely (checkpointer.go); never part of the image.
	imageDoneFile = "complete"
)

// Pause implements runtime.Driver.
func (d *Driver) Pause(ctx context.Context, id string) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := d.boxes.admitFence(ctx, id); err != nil {
		return err
	}
	rec, err := d.boxes.readRecord(id)
	if err != nil {
		return err
	}
	ident, err := d.identity()
	if err != nil {
		return err
	}
	phase, reason, err := d.observe(ctx, id)
	if err != nil {
		return err
	}
	if phase != runtime.PhaseRunning {
		if ok, err := d.settleImage(id); err != nil {
			return err
		} else if ok {
			return nil // paused before
		}
		if reason != "" {
			return fmt.Errorf("gvisor: box %s is %s (%s): nothing to pause: %w", id, phase, reason, runtime.ErrNotRunning)
		}
		return fmt.Errorf("gvisor: box %s is %s: nothing to pause: %w", id, phase, runtime.ErrNotRunning)
	}
	start := time.Now()
	flags, err := d.containerFlags(id)
	if err != nil {
		return err
	}
	newDir := d.boxes.boxPath(id, memoryNewDn)
	keep := d.boxes.boxPath(id, memoryDn)
	// Neither this marker nor meta.json below is synced to the disk: they matter only while
	// this host runs (a host that restarts has no box left to attach to, and its kept image
	// is checked against its sums, or refused, before a resume).
	if err := os.WriteFile(d.boxes.boxPath(id, pausingFile), []byte(start.UTC().Format(time.RFC3339Nano)), 0o600); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	defer d.clearPausing(id)

	// The checkpoint's shell starts while the box is asked to quiesce (checkpointer.go).
	cp, err := d.startCheckpointer(ctx, id, flags, newDir, imageTimeout(rec.Spec))
	if err != nil {
		return err
	}
	// meta.json first, then the checkpoint: a server killed while runsc saves the box still
	// leaves a complete image, which the pause that finishes this one takes (settleImage).
	meta := imageMeta{Format: imageFormat, Box: id, Runsc: ident.runsc, Host: ident.host,
		Network: rec.Spec.Network, CreatedAt: start.UTC()}
	if err := prepareImageDirs(newDir, keep, meta); err != nil {
		cp.abort()
		return fmt.Errorf("gvisor: pause %s: %w", id, err)
	}
	if err := d.quiesce(ctx, id, d.spares.Take(id)); err != nil {
		cp.abort()
		return err
	}
	t1 := time.Now()
	err = cp.run()
	if err == nil {
		var ok bool
		if ok, err = d.settleImage(id); err == nil && !ok {
			err = fmt.Errorf("runsc checkpoint left no image in %s", newDir)
		}
	}
	if err != nil {
		_ = os.RemoveAll(newDir)
		if phase, _, oerr := d.observe(ctx, id); oerr == nil && phase == runtime.PhaseRunning {
			d.reopen(ctx, id, flags)
			return fmt.Errorf("gvisor: pause %s: %w", id, err)
		}
		return fmt.Errorf("gvisor: pause %s: the checkpoint failed and ended the sandbox (its workspace is intact): %w", id, err)
	}
	// The sandbox and its gofer ended with the checkpoint: the rest of the container's
	// deletion follows in the background (teardown.go).
	d.startTeardown(id)
	t2 := time.Now()
	d.log.Info("box paused", "box", id, "quiesce_ms", t1.Sub(start).Milliseconds(),
		"checkpoint_ms", t2.Sub(t1).Milliseconds(), "ms", time.Since(start).Milliseconds())
	return nil
}

// prepareImageDirs makes newDir afresh with the image's meta.json in it, and removes keep (the
// image of an earlier pause, which this box's resume consumed).
func prepareImageDirs(newDir, keep string, meta imageMeta) error {
	if err := os.RemoveAll(newDir); err != nil {
		return err
	}
	if err := os.Mkdir(newDir, 0o700); err != nil {
		return err
	}
	mb, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(newDir, imageMetaFile), append(mb, '\n'), 0o600); err != nil {
		return err
	}
	return os.RemoveAll(keep)
}

// quiesce asks the box's guest init to close its host socket. It asks over the caller's
// attach when ctx carries one (runtime.WithQuiesce), else over spare (the attach that proved
// the box's last start or resume ready, whose handshake is done), else over a stream of its
// own on that socket; a stream that fails (not the guest's refusal, which is the answer) leaves
// it to the next. A box whose socket does not answer may have been quiesced by a pause that was
// cut short: it is asked to listen again first. quiesce closes spare.
func (d *Driver) quiesce(ctx context.Context, id string, spare io.ReadWriteCloser) error {
	answered := func(err error) bool {
		var ge *proto.Error
		return err == nil || errors.As(err, &ge)
	}
	if fn := runtime.QuiesceFrom(ctx); fn != nil {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(qctx)
		cancel()
		if answered(err) {
			if spare != nil {
				spare.Close()
			}
			return wrapQuiesce(id, err)
		}
		d.log.Info("quiescing a box over the caller's attach failed", "box", id, "err", err)
	}
	if spare != nil {
		err := quiesceOver(ctx, spare)
		if answered(err) {
			return wrapQuiesce(id, err)
		}
		d.log.Info("quiescing a box over its spare attach failed", "box", id, "err", err)
	}
	key, err := d.channelKey(id)
	if err != nil {
		return err
	}
	conn, err := d.dialHost(ctx, id, key)
	if err != nil && !errors.Is(err, errTampered) {
		flags, ferr := d.containerFlags(id)
		if ferr != nil {
			return ferr
		}
		d.reopen(ctx, id, flags)
		conn, err = d.dialHostWithin(ctx, id, key, 2*time.Second)
	}
	if err != nil {
		return fmt.Errorf("gvisor: pause %s: reaching its guest init: %w", id, err)
	}
	return wrapQuiesce(id, quiesceOver(ctx, conn))
}

// quiesceOver makes the quiesce call on conn, a stream whose handshake is done (no health
// call: its one call answers too), and closes it.
func quiesceOver(ctx context.Context, conn io.ReadWriteCloser) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := client.DialUnchecked(qctx, conn)
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	_, err = c.Quiesce(qctx)
	return err
}

func wrapQuiesce(id string, err error) error {
	if err != nil {
		return fmt.Errorf("gvisor: pause %s: %w", id, err)
	}
	return nil
}

// dialHostWithin dials the box's host socket until it answers or within passes.
func (d *Driver) dialHostWithin(ctx context.Context, id string, key []byte, within time.Duration) (io.ReadWriteCloser, error) {
	deadline := time.Now().Add(within)
	for {
		c, err := d.dialHost(ctx, id, key)
		if err == nil || errors.Is(err, errTampered) || time.Now().After(deadline) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// reopen asks the box's guest init to listen on its host socket again: the marker in the host
// folder, then the signal (proto/pause.go). Best effort: a box that does not listen is then
// reached through `runsc exec … connect`.
func (d *Driver) reopen(ctx context.Context, id string, flags []string) {
	if err := d.askReopen(ctx, id, flags); err != nil {
		d.log.Warn("asking a box's init to listen on its host socket again", "box", id, "err", err)
	}
}

func (d *Driver) askReopen(ctx context.Context, id string, flags []string) error {
	if flags == nil {
		var err error
		if flags, err = d.containerFlags(id); err != nil {
			return err
		}
	}
	marker := filepath.Join(d.boxes.boxPath(id, hostDn), proto.ReopenMarker)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return fmt.Errorf("gvisor: reopen marker: %w", err)
	}
	if _, err := d.runsc(ctx, flags, "kill", id, proto.ReopenSignal); err != nil {
		return fmt.Errorf("gvisor: reopen signal: %w", err)
	}
	return nil
}

// clearPausing removes the marker of a pause in flight: what a pause cut short (a killed
// server) left behind must not keep attaches away once the box runs or is stopped.
func (d *Driver) clearPausing(id string) {
	if err := os.Remove(d.boxes.boxPath(id, pausingFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("removing a pause's marker", "box", id, "err", err)
	}
}

// hasImage reports whether the box has a complete kept image.
func (d *Driver) hasImage(id string) bool {
	_, err := os.Stat(filepath.Join(d.boxes.boxPath(id, memoryDn), imageMetaFile))
	return err == nil
}

// MemoryImage implements runtime.Driver: the kept image as a tar stream, meta.json first.
func (d *Driver) MemoryImage(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	dir := d.boxes.boxPath(id, memoryDn)
	if !d.hasImage(id) {
		return nil, fmt.Errorf("gvisor: box %s has no kept memory image: %w", id, runtime.ErrNotFound)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
	}
	// runsc's files only: sums.json is the host's note of an earlier read (a store retried
	// after a crash reads the image again), never part of the image.
	names := []string{imageMetaFile}
	for _, e := range entries {
		if n := e.Name(); n != imageMetaFile && n != imageSumsFile && e.Type().IsRegular() && imageName.MatchString(n) {
			names = append(names, e.Name())
		}
	}
	// Open them all now: a drop racing the read then cannot cut the archive short.
	files := make([]*os.File, 0, len(names))
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
		}
		files = append(files, f)
	}
	// The image's meta.json (the pause's time, to the nanosecond) tells it from a later pause's.
	made, err := os.ReadFile(filepath.Join(dir, imageMetaFile))
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
	}
	pr, pw := io.Pipe()
	go func() {
		defer closeAll()
		sums, err := writeImageTar(pw, names, files)
		if err == nil {
			// The files' sums, taken on the way: what a resume here checks the kept copy against.
			err = d.writeSums(id, dir, made, sums)
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// writeSums writes the sums of the image MemoryImage streamed beside its files, unless the
// image was replaced meanwhile (resumed and paused again: made is the meta.json it read) or
// dropped. Under the box's lock, which every pause and drop of its image holds.
func (d *Driver) writeSums(id, dir string, made []byte, sums imageSums) error {
	unlock := d.boxMu.lock(id)
	defer unlock()
	now, err := os.ReadFile(filepath.Join(dir, imageMetaFile))
	if err != nil || !bytes.Equal(made, now) {
		return fmt.Errorf("gvisor: memory image of %s: replaced or dropped while it was read", id)
	}
	return writeJSONAtomic(filepath.Join(dir, imageSumsFile), sums)
}

// DropMemoryImage implements runtime.Driver.
func (d *Driver) DropMemoryImage(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := d.boxes.admitFence(ctx, id); err != nil {
		if errors.Is(err, runtime.ErrNotFound) {
			return nil
		}
		return err
	}
	return d.dropImages(id)
}

// dropImages removes every memory image folder of the box.
func (d *Driver) dropImages(id string) error {
	var errs []error
	for _, dn := range []string{memoryDn, memoryNewDn, memoryRestoreDn} {
		if err := os.RemoveAll(d.boxes.boxPath(id, dn)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gvisor: memory images of %s: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Driver.
func (d *Driver) Resume(ctx context.Context, id string, stored runtime.ImageSource) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := d.boxes.admitFence(ctx, id); err != nil {
		return err
	}
	rec, err := d.boxes.readRecord(id)
	if err != nil {
		return err
	}
	phase, _, err := d.observe(ctx, id)
	if err != nil {
		return err
	}
	d.clearPausing(id)
	if phase == runtime.PhaseRunning {
		// Restored already (a resume cut short after `runsc restore`): make sure it listens.
		if err := d.askReopen(ctx, id, nil); err != nil {
			return err
		}
		return d.waitReady(ctx, id)
	}
	start := time.Now()
	ident, err := d.identity()
	if err != nil {
		return err
	}
	// The kept copy when it is intact (no download, no extraction); else the stored one.
	if _, err := d.settleImage(id); err != nil {
		return err
	}
	dir := d.boxes.boxPath(id, memoryDn)
	meta, ok, why := checkKept(dir)
	source := "kept"
	if ok && why == "no sums" {
		source = "kept, not stored yet"
	}
	if !ok {
		if d.hasImage(id) {
			d.log.Warn("the kept memory image does not match its sums; using the stored one", "box", id, "why", why)
		}
		source = "stored"
		dir = d.boxes.boxPath(id, memoryRestoreDn)
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
		defer os.RemoveAll(dir)
		rc, err := stored(ctx)
		if err != nil {
			return err
		}
		meta, err = extractImage(rc, dir, maxImageBytes(rec.Spec))
		rc.Close()
		if err != nil {
			return err
		}
	}
	switch {
	case meta.Format != imageFormat:
		return &runtime.ImageError{Reason: fmt.Sprintf("the image's format %d is not this driver's (%d)", meta.Format, imageFormat)}
	case meta.Box != id:
		return &runtime.ImageError{Reason: "the image is another sandbox's", Corrupt: true}
	case meta.Host != ident.host:
		return &runtime.ImageError{Reason: "the image was made on another host"}
	case meta.Runsc != ident.runsc:
		return &runtime.ImageError{Reason: "the image was made by another runsc build (runsc was upgraded since the pause)"}
	case meta.Network != rec.Spec.Network:
		return &runtime.ImageError{Reason: "the image was made with another network mode"}
	}
	t1 := time.Now()
	flags, err := d.containerFlags(id)
	if err != nil {
		return err
	}
	bundle := d.boxes.boxPath(id, bundleDn)
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
		return &runtime.ImageError{Reason: "the box's container bundle is gone", Err: err}
	}
	if err := d.destroyContainer(ctx, id); err != nil {
		return err
	}
	// The workspace the image's open files refer to: the same disk, at the same path (still
	// mounted when the pause's stop kept it).
	if err := d.takeKept(id); err != nil {
		return err
	}
	fresh, err := d.disks.ensureDisk(ctx, id, rec.Spec)
	if err != nil {
		return err
	}
	fail := func(cause error) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cliTimeout)
		defer cancel()
		if cerr := d.destroyContainer(cctx, id); cerr != nil {
			d.log.Error("cleanup after a failed resume", "box", id, "err", cerr)
		} else if uerr := d.disks.unmountDisk(id); uerr != nil {
			d.log.Error("cleanup after a failed resume", "box", id, "err", uerr)
		}
		return cause
	}
	if fresh {
		return fail(&runtime.ImageError{Reason: "the sandbox's workspace disk is gone, and the image's processes need it"})
	}
	if rec.Spec.Network == netpolicy.ModeEgress {
		if _, err := d.net.up(id, rec.Spec.NetworkPolicy); err != nil {
			return fail(err)
		}
	}
	hostDir := d.boxes.boxPath(id, hostDn)
	if err := os.Remove(filepath.Join(hostDir, hostSocketName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(fmt.Errorf("gvisor: host socket folder: %w", err))
	}
	// The marker first: the restored init, quiesced, finds it within a poll and listens.
	if err := os.WriteFile(filepath.Join(hostDir, proto.ReopenMarker), nil, 0o600); err != nil {
		return fail(fmt.Errorf("gvisor: reopen marker: %w", err))
	}
	if err := os.Remove(d.boxes.boxPath(id, tamperedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(fmt.Errorf("gvisor: %w", err))
	}
	d.rotateLog(id)
	unlockCreate := d.lockForCreate()
	err = d.runscLogged(ctx, id, imageTimeout(rec.Spec), flags, "restore", "--image-path="+dir, "--bundle="+bundle, "--detach", id)
	unlockCreate()
	if err != nil {
		return fail(&runtime.ImageError{Reason: "runsc could not restore the image: " + strings.TrimPrefix(err.Error(), "runsc "), Err: err})
	}
	t2 := time.Now()
	if err := d.waitListening(ctx, id, flags); err != nil {
		return fail(&runtime.ImageError{Reason: "the restored sandbox's init does not answer", Err: err})
	}
	if err := d.dropImages(id); err != nil {
		d.log.Warn("removing a resumed box's image", "box", id, "err", err)
	}
	d.log.Info("box resumed", "box", id, "image", source, "image_ms", t1.Sub(start).Milliseconds(),
		"restore_ms", t2.Sub(t1).Milliseconds(), "ms", time.Since(start).Milliseconds())
	return nil
}

// reopenPolls is how long a restored box gets to find the reopen marker by itself before the
// driver sends the signal too.
const reopenPolls = 300 * time.Millisecond

// waitListening waits until the restored box's init answers on its host socket: it finds the
// marker by itself (proto/pause.go); when it has not within reopenPolls, the signal asks it.
func (d *Driver) waitListening(ctx context.Context, id string, flags []string) error {
	deadline := time.Now().Add(reopenPolls)
	for time.Now().Before(deadline) {
		if err := d.probe(ctx, id); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	d.log.Info("the restored init did not listen by itself; signalling it", "box", id)
	if _, err := d.runsc(ctx, flags, "kill", id, proto.ReopenSignal); err != nil {
		d.log.Warn("signalling a restored box's init", "box", id, "err", err)
	}
	return d.waitReady(ctx, id)
}
