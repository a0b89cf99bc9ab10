package runtimetest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"sandboxd/runtime"
)

// The Fake's pause: Pause keeps the box's guest server aside (its commands run on, on the
// host: the fake does not freeze them) and breaks the box's attaches, as runsc's save does;
// its image is a small tar (meta.json naming the box and the pause, and a checkpoint.img of
// random bytes) that only brings that very server back. The Fake keeps the image until
// Resume, Start, DropMemoryImage or Delete, and a Resume uses its kept copy first, as the
// local driver does. A Resume with another image, or after LoseMemory, is a
// *runtime.ImageError, as a real driver's with an image it cannot restore.

// fakeImageMeta is the meta.json of a Fake's image.
type fakeImageMeta struct {
	Box   string `json:"box"`
	Pause int    `json:"pause"`
}

// maxFakeImage bounds what Resume reads of an image.
const maxFakeImage = 1 << 20

// LoseMemory drops what a paused box's memory image would bring back (as a host change or a
// runsc upgrade would): a later Resume is an *runtime.ImageError.
func (f *Fake) LoseMemory(id string) error {
	f.mu.Lock()
	b, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	srv := b.paused
	b.paused = nil
	f.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	return nil
}

// Pause implements runtime.Driver.
func (f *Fake) Pause(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Pause"); err != nil {
		return err
	}
	b, ok := f.boxes[id]
	if !ok {
		return fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	if err := b.admit(ctx); err != nil {
		return err
	}
	if b.phase != runtime.PhaseRunning {
		if b.image != nil {
			return nil
		}
		return fmt.Errorf("fake: box %s is %s: nothing to pause: %w", id, b.phase, runtime.ErrNotRunning)
	}
	b.pauseGen++
	img, err := fakeImage(fakeImageMeta{Box: id, Pause: b.pauseGen})
	if err != nil {
		return err
	}
	b.paused, b.srv, b.image = b.srv, nil, img
	b.phase, b.reason, b.lost = runtime.PhaseStopped, "", false
	for c := range b.conns {
		_ = c.Close()
	}
	return nil
}

func fakeImage(m fakeImageMeta) ([]byte, error) {
	meta, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	pages := make([]byte, 4096)
	_, _ = rand.Read(pages)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct {
		name string
		data []byte
	}{{"meta.json", meta}, {"checkpoint.img", pages}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// MemoryImage implements runtime.Driver. While an ImageGate (GateMemoryImages) holds them, the
// images it returns give nothing until the gate opens (or their reader's ctx ends).
func (f *Fake) MemoryImage(ctx context.Context, id string) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("MemoryImage"); err != nil {
		return nil, err
	}
	b, ok := f.boxes[id]
	if !ok || b.image == nil {
		return nil, fmt.Errorf("fake: box %s has no kept memory image: %w", id, runtime.ErrNotFound)
	}
	r := io.NopCloser(bytes.NewReader(b.image))
	if g := f.imageGate; g != nil {
		select {
		case g.opened <- id:
		default:
		}
		return &gatedReader{ctx: ctx, gate: g.gate, r: r}, nil
	}
	return r, nil
}

// ImageGate holds the memory images the Fake hands out (GateMemoryImages): a test's way to have
// a pause's store still reading while the sandbox moves on.
type ImageGate struct {
	f      *Fake
	gate   chan struct{}
	opened chan string
	once   sync.Once
}

// GateMemoryImages holds the images MemoryImage returns from now on until the gate's Open.
func (f *Fake) GateMemoryImages() *ImageGate {
	g := &ImageGate{f: f, gate: make(chan struct{}), opened: make(chan string, 64)}
	f.mu.Lock()
	f.imageGate = g
	f.mu.Unlock()
	return g
}

// Opened delivers the id of each image handed out while the gate holds them.
func (g *ImageGate) Opened() <-chan string { return g.opened }

// Open lets the held images be read, and the later ones go ungated.
func (g *ImageGate) Open() {
	g.once.Do(func() {
		g.f.mu.Lock()
		g.f.imageGate = nil
		g.f.mu.Unlock()
		close(g.gate)
	})
}

// gatedReader reads r once gate is closed.
type gatedReader struct {
	ctx  context.Context
	gate chan struct{}
	r    io.ReadCloser
}

func (g *gatedReader) Read(p []byte) (int, error) {
	select {
	case <-g.gate:
		return g.r.Read(p)
	case <-g.ctx.Done():
		return 0, g.ctx.Err()
	}
}

func (g *gatedReader) Close() error { return g.r.Close() }

// DropMemoryImage implements runtime.Driver: the image goes; the server it names stays for a
// Resume with a copy of it.
func (f *Fake) DropMemoryImage(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return nil
	}
	if err := b.admit(ctx); err != nil {
		return err
	}
	b.image = nil
	return nil
}

// Resume implements runtime.Driver: from the kept image when there is one, else from the
// stored copy.
func (f *Fake) Resume(ctx context.Context, id string, stored runtime.ImageSource) error {
	f.mu.Lock()
	b, ok := f.boxes[id]
	var kept []byte
	if ok {
		kept = b.image
	}
	f.mu.Unlock()
	data := kept
	if data == nil {
		// The image is read (to its end) before the lock: a checkpoint reader hashes as it goes.
		rc, err := stored(ctx)
		if err != nil {
			return err
		}
		data, err = io.ReadAll(io.LimitReader(rc, maxFakeImage+1))
		rc.Close()
		if err != nil {
			return &runtime.ImageError{Reason: "the image could not be read: " + err.Error(), Err: err}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Resume"); err != nil {
		return err
	}
	if b, ok = f.boxes[id]; !ok {
		return fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	if err := b.admit(ctx); err != nil {
		return err
	}
	if b.phase == runtime.PhaseRunning {
		return nil
	}
	if len(data) > maxFakeImage {
		return &runtime.ImageError{Reason: "the image is too large", Corrupt: true}
	}
	var meta fakeImageMeta
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &runtime.ImageError{Reason: "the image is not an archive", Corrupt: true, Err: err}
		}
		if h.Name == "meta.json" {
			if err := json.NewDecoder(io.LimitReader(tr, 4096)).Decode(&meta); err != nil {
				return &runtime.ImageError{Reason: "the image's meta.json is unreadable", Corrupt: true, Err: err}
			}
		}
	}
	switch {
	case meta.Box != id:
		return &runtime.ImageError{Reason: "the image is another box's", Corrupt: true}
	case b.paused == nil || meta.Pause != b.pauseGen:
		return &runtime.ImageError{Reason: "the image's processes are gone"}
	case f.closed:
		return errors.New("fake: closed")
	}
	b.srv, b.paused, b.image = b.paused, nil, nil
	b.phase, b.reason, b.lost = runtime.PhaseRunning, "", false
	return nil
}
