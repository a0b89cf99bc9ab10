package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"

	"golang.org/x/sys/unix"
)

// events reads a watch's events until want says it has what it waits for (or d passes).
func events(t *testing.T, r *client.WatchReader, d time.Duration, done func([]proto.WatchEvent) bool) []proto.WatchEvent {
	t.Helper()
	type res struct {
		ev  proto.WatchEvent
		err error
	}
	ch := make(chan res, 1)
	var got []proto.WatchEvent
	deadline := time.After(d)
	for !done(got) {
		go func() {
			ev, err := r.Next()
			ch <- res{ev, err}
		}()
		select {
		case x := <-ch:
			if x.err != nil {
				t.Fatalf("after %s: %v", describe(got), x.err)
			}
			got = append(got, x.ev)
		case <-deadline:
			r.Close()
			<-ch
			t.Fatalf("after %v got %s, want more", d, describe(got))
		}
	}
	return got
}

func describe(evs []proto.WatchEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %d %s %s", e.Seq, e.Kind, e.Path)
		if e.From != "" {
			fmt.Fprintf(&b, " (from %s)", e.From)
		}
		if e.Reason != "" || e.Code != "" {
			fmt.Fprintf(&b, " [%s%s %s missed %d]", e.Reason, e.Code, e.Message, e.Missed)
		}
	}
	return b.String()
}

// has reports whether evs hold an event of kind on p (and from, for moves).
func has(evs []proto.WatchEvent, kind, p, from string) bool {
	for _, e := range evs {
		if e.Kind == kind && e.Path == p && e.From == from {
			return true
		}
	}
	return false
}

func TestWatchRecursive(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	outside, untouched := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"src/old.txt": "o", "src/deep/x": "x"})
	must(t, os.Symlink(outside, filepath.Join(h.WS, "src/out")))

	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: "src", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Dirs != 2 || info.Path != "src" || info.Seq != 0 {
		t.Fatalf("watch: got %+v, want src and src/deep watched from seq 0", info)
	}
	r, err := h.C.WatchEvents(ctx, info.ID, 0, "src", true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ws := h.WS
	must(t, os.WriteFile(filepath.Join(ws, "src/new.txt"), []byte("1"), 0o644))
	must(t, os.WriteFile(filepath.Join(ws, "src/deep/x"), []byte("changed"), 0o644))
	must(t, os.Rename(filepath.Join(ws, "src/old.txt"), filepath.Join(ws, "src/deep/renamed.txt")))
	// A new directory is watched at once, and what it holds by then is reported by a scan.
	must(t, os.MkdirAll(filepath.Join(ws, "src/n1/n2"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, "src/n1/n2/f"), nil, 0o644))
	must(t, os.Remove(filepath.Join(ws, "src/new.txt")))
	// Moving a directory out of the tree is its deletion; into it, its creation.
	must(t, os.Rename(filepath.Join(ws, "src/deep"), filepath.Join(ws, "deep-out")))
	must(t, os.Mkdir(filepath.Join(ws, "bring"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, "bring/b"), nil, 0o644))
	must(t, os.Rename(filepath.Join(ws, "bring"), filepath.Join(ws, "src/bring")))
	// Writing through the link to outside is not the watch's business: nothing follows it.
	must(t, os.WriteFile(filepath.Join(outside, "sub/noise"), nil, 0o644))
	must(t, os.Remove(filepath.Join(outside, "sub/noise")))

	want := []struct{ kind, path, from string }{
		{proto.EventCreated, "src/new.txt", ""},
		{proto.EventModified, "src/new.txt", ""},
		{proto.EventModified, "src/deep/x", ""},
		{proto.EventMoved, "src/deep/renamed.txt", "src/old.txt"},
		{proto.EventCreated, "src/n1", ""},
		{proto.EventCreated, "src/n1/n2/f", ""},
		{proto.EventDeleted, "src/new.txt", ""},
		{proto.EventDeleted, "src/deep", ""},
		{proto.EventCreated, "src/bring", ""},
		{proto.EventCreated, "src/bring/b", ""},
	}
	got := events(t, r, 10*time.Second, func(evs []proto.WatchEvent) bool {
		for _, w := range want {
			if !has(evs, w.kind, w.path, w.from) {
				return false
			}
		}
		return true
	})
	for i, e := range got {
		if e.Seq != uint64(i+1) {
			t.Errorf("event %d has seq %d, want %d", i, e.Seq, i+1)
		}
		if strings.Contains(e.Path, "noise") || strings.HasPrefix(e.Path, "/") {
			t.Errorf("event %+v: a path outside the tree or absolute", e)
		}
	}
	// Changes in the moved-out directory are no longer reported; the moved-in one is watched.
	must(t, os.WriteFile(filepath.Join(ws, "deep-out/after"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(ws, "src/bring/later"), nil, 0o644))
	more := events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool { return has(evs, proto.EventCreated, "src/bring/later", "") })
	for _, e := range more {
		if strings.Contains(e.Path, "after") {
			t.Errorf("got %+v from a directory that left the tree", e)
		}
	}
	untouched()
}

// TestWatchHidesOwnNames: a recursive delete through the API is the folder's deletion; the
// trash folder it goes through is never reported.
func TestWatchHidesOwnNames(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	writeTree(t, h.WS, map[string]string{"gone/a/b": "x"})
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: ".", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	must(t, h.C.Remove(ctx, "gone", true))
	if _, err := h.C.WriteFile(ctx, "written.txt", 0o644, strings.NewReader("w")); err != nil {
		t.Fatal(err)
	}
	got := events(t, r, 10*time.Second, func(evs []proto.WatchEvent) bool {
		return has(evs, proto.EventDeleted, "gone", "") && has(evs, proto.EventCreated, "written.txt", "")
	})
	for _, e := range got {
		if strings.Contains(e.Path+e.From, ".sbx-") {
			t.Errorf("reported the server's own name: %+v", e)
		}
	}
}

// TestWatchResume: a reader that goes away and comes back after its last sequence misses
// nothing; one that comes back later than the ring keeps gets an overflow saying how much.
func TestWatchResume(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: ".", MaxEvents: 8})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.C.WatchEvents(ctx, info.ID, 0, ".", false)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Mkdir(filepath.Join(h.WS, "f0"), 0o755))
	first := events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool { return has(evs, proto.EventCreated, "f0", "") })
	r.Close()
	last := first[len(first)-1].Seq
	for i := 1; i <= 3; i++ {
		must(t, os.Mkdir(filepath.Join(h.WS, fmt.Sprintf("d%d", i)), 0o755))
	}
	time.Sleep(200 * time.Millisecond)
	r, err = h.C.WatchEvents(ctx, info.ID, last, ".", false)
	if err != nil {
		t.Fatal(err)
	}
	got := events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool { return len(evs) == 3 })
	for i, e := range got {
		if e.Seq != last+uint64(i)+1 || e.Kind != proto.EventCreated || e.Path != fmt.Sprintf("d%d", i+1) || !e.IsDir {
			t.Errorf("resumed event %d: got %+v, want d%d created right after seq %d", i, e, i+1, last)
		}
	}
	r.Close()
	last = got[2].Seq
	// 20 more than the ring of 8 keeps.
	for i := range 20 {
		must(t, os.Mkdir(filepath.Join(h.WS, fmt.Sprintf("e%02d", i)), 0o755))
	}
	time.Sleep(200 * time.Millisecond)
	r, err = h.C.WatchEvents(ctx, info.ID, last, ".", false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got = events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool { return len(evs) == 9 })
	if o := got[0]; o.Kind != proto.EventOverflow || o.Reason != proto.ReasonRing || o.Missed != 12 || o.Seq != last+12 {
		t.Errorf("got %+v first, want an overflow of 12 events (ring) ending at seq %d", o, last+12)
	}
	if e := got[8]; e.Path != "e19" {
		t.Errorf("got %+v last, want e19", e)
	}
	// A cursor of another watch's path, or one ahead of the watch, is refused.
	_, err = h.C.WatchEvents(ctx, info.ID, 0, "other", false)
	wantCode(t, err, proto.ErrCodeInvalid)
	_, err = h.C.WatchEvents(ctx, info.ID, 0, ".", true)
	wantCode(t, err, proto.ErrCodeInvalid)
	_, err = h.C.WatchEvents(ctx, info.ID, 1<<40, ".", false)
	wantCode(t, err, proto.ErrCodeInvalid)
	_, err = h.C.WatchEvents(ctx, "w0000000000000000", 0, "", false)
	wantCode(t, err, proto.ErrCodeGone)
}

// TestWatchCoalesces: a file written many times in a burst is a few MODIFIED events, the
// last one after the burst.
func TestWatchCoalesces(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	must(t, os.WriteFile(filepath.Join(h.WS, "log"), nil, 0o644))
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: "."})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := os.OpenFile(filepath.Join(h.WS, "log"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	for range 1000 {
		_, _ = f.WriteString("line\n")
	}
	must(t, f.Close())
	must(t, os.WriteFile(filepath.Join(h.WS, "marker"), nil, 0o644))
	got := events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool { return has(evs, proto.EventCreated, "marker", "") })
	mods := 0
	for _, e := range got {
		if e.Kind == proto.EventModified && e.Path == "log" {
			mods++
		}
	}
	if mods < 1 || mods > 4 {
		t.Errorf("1000 writes and a close gave %d MODIFIED events, want 1 to 4 (coalesced): %s", mods, describe(got))
	}
}

func TestWatchLimitsAndEnd(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	outside, _ := outsideDir(t)
	writeTree(t, h.WS, map[string]string{"t/a/x": "", "t/b/x": "", "t/c/x": "", "file": ""})
	must(t, os.Symlink(outside, filepath.Join(h.WS, "out")))

	_, err := h.C.Watch(ctx, proto.WatchRequest{Path: "t", Recursive: true, MaxDirs: 3})
	wantCode(t, err, proto.ErrCodeTooLarge)
	for path, code := range map[string]string{"out": proto.ErrCodeInvalid, "out/sub": proto.ErrCodeInvalid,
		"file": proto.ErrCodeNotDir, "missing": proto.ErrCodeNotFound, "/etc": proto.ErrCodeInvalid} {
		_, err := h.C.Watch(ctx, proto.WatchRequest{Path: path, Recursive: true})
		wantCode(t, err, code)
	}
	for i := range 2 {
		if _, err := h.C.Watch(ctx, proto.WatchRequest{Path: "t", MaxWatches: 3}); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	// A directory beyond the limit is reported, not silently missed.
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: "t", Recursive: true, MaxDirs: 4, MaxWatches: 3})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.C.Watch(ctx, proto.WatchRequest{Path: "t", MaxWatches: 3})
	wantCode(t, err, proto.ErrCodeTooMany)
	r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	must(t, os.Mkdir(filepath.Join(h.WS, "t/d"), 0o755))
	must(t, os.Mkdir(filepath.Join(h.WS, "t/e"), 0o755))
	events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool {
		for _, e := range evs {
			if e.Kind == proto.EventOverflow && e.Reason == proto.ReasonDirs && e.Path == "t/e" {
				return true
			}
		}
		return false
	})
	// Deleting the watched folder ends the watch with an explicit end.
	must(t, os.RemoveAll(filepath.Join(h.WS, "t")))
	got := events(t, r, 5*time.Second, func(evs []proto.WatchEvent) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == proto.EventEnd
	})
	if end := got[len(got)-1]; end.Code != proto.ErrCodeNotFound {
		t.Errorf("end: got %+v, want code not_found", end)
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the end: got %v, want EOF", err)
	}
}

func TestWatchExpires(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: ".", GraceMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	// A reader holds it past the grace period.
	rctx, cancel := context.WithCancel(ctx)
	r, err := h.C.WatchEvents(rctx, info.ID, 0, "", false)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	r2, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
	if err != nil {
		t.Fatalf("a watch with a reader expired: %v", err)
	}
	r2.Close()
	cancel()
	r.Close()
	// Every look is a reader (which restarts the grace period): look less often than it.
	waitFor(t, func() bool {
		time.Sleep(300 * time.Millisecond)
		r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
		if err == nil {
			r.Close()
		}
		var ge *proto.Error
		return errors.As(err, &ge) && ge.Code == proto.ErrCodeGone
	})
	info, err = h.C.Watch(ctx, proto.WatchRequest{Path: "."})
	if err != nil {
		t.Fatal(err)
	}
	must(t, h.C.DeleteWatch(ctx, info.ID))
	_, err = h.C.WatchEvents(ctx, info.ID, 0, "", false)
	wantCode(t, err, proto.ErrCodeGone)
}

// TestWatchReaders: a watch takes at most MaxWatchReaders readers at once.
func TestWatchReaders(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: "."})
	if err != nil {
		t.Fatal(err)
	}
	var readers []*client.WatchReader
	for range proto.MaxWatchReaders {
		r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	_, err = h.C.WatchEvents(ctx, info.ID, 0, "", false)
	wantCode(t, err, proto.ErrCodeTooMany)
	readers[0].Close()
	waitFor(t, func() bool {
		r, err := h.C.WatchEvents(ctx, info.ID, 0, "", false)
		if err == nil {
			readers[0] = r
		}
		return err == nil
	})
	for _, r := range readers {
		r.Close()
	}
}

// TestWatchDeepTree: a workload that nests folders deeper than a path may name (each level
// made relative to the one above, as only *at calls can) gets the folders past
// proto.MaxWatchPath reported as not watched, and no event longer than the bound and one name:
// a reader's line limit is never reached, however deep the tree.
func TestWatchDeepTree(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	must(t, os.Mkdir(filepath.Join(h.WS, "deep"), 0o755))
	info, err := h.C.Watch(ctx, proto.WatchRequest{Path: "deep", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.C.WatchEvents(ctx, info.ID, 0, "deep", true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	name := strings.Repeat("d", 250)
	fd, err := unix.Open(filepath.Join(h.WS, "deep"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	const levels = 24 // 24 × 251 bytes: past proto.MaxWatchPath
	for range levels {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	f, err := unix.Openat(fd, "leaf", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
	unix.Close(fd)

	got := events(t, r, 15*time.Second, func(evs []proto.WatchEvent) bool {
		for _, e := range evs {
			if e.Kind == proto.EventOverflow && e.Reason == proto.ReasonDirs {
				return true
			}
		}
		return false
	})
	for _, e := range got {
		if len(e.Path) > proto.MaxWatchPath+256 || len(e.From) > proto.MaxWatchPath+256 {
			t.Fatalf("an event of %d bytes of path: longer than the bound and one name", len(e.Path))
		}
	}
	// The stream goes on after the deep folders: a change near the top is still reported.
	must(t, os.WriteFile(filepath.Join(h.WS, "deep", "top"), nil, 0o644))
	events(t, r, 10*time.Second, func(evs []proto.WatchEvent) bool { return has(evs, proto.EventCreated, "deep/top", "") })
}
