package gvisor_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

// counterLoop runs in the background of a box: it writes its pid and a rising counter to
// /tmp/counter every 20 ms.
const counterLoop = `i=0; while :; do i=$((i+1)); echo "$$ $i" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.02; done`

// readCounter reads the loop's pid and count.
func readCounter(t *testing.T, c *client.Client) (pid, n int) {
	t.Helper()
	res := runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"cat", "/tmp/counter"}})
	f := strings.Fields(string(res.Stdout))
	if len(f) != 2 {
		t.Fatalf("counter file holds %q", res.Stdout)
	}
	pid, _ = strconv.Atoi(f[0])
	n, _ = strconv.Atoi(f[1])
	return pid, n
}

// source is an ImageSource of a stored image.
func source(img []byte) runtime.ImageSource {
	return func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(img)), nil }
}

// noSource is the ImageSource of a resume that must use the driver's kept copy.
func noSource(t *testing.T) runtime.ImageSource {
	return func(context.Context) (io.ReadCloser, error) {
		t.Error("the driver opened the stored image, want it to use its kept copy")
		return nil, errors.New("no stored image")
	}
}

// pauseBox pauses a box and returns its image, then releases the rest (Stop), as the domain
// does; unless keep, it also drops the driver's copy (a resume then needs the stored one).
func pauseBox(t *testing.T, d *gvisor.Driver, id string) []byte {
	return pauseBoxKeeping(t, d, id, false)
}

func pauseBoxKeeping(t *testing.T, d *gvisor.Driver, id string, keep bool) []byte {
	t.Helper()
	start := time.Now()
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause took %v", time.Since(start))
	rc, err := d.MemoryImage(ctxT(t), id)
	if err != nil {
		t.Fatalf("MemoryImage: %v", err)
	}
	img, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("reading the image: %v", err)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatalf("Stop after Pause: %v", err)
	}
	if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseStopped {
		t.Fatalf("after pause and stop the box is %s, want stopped", b.Phase)
	}
	if !keep {
		if err := d.DropMemoryImage(ctxT(t), id); err != nil {
			t.Fatalf("DropMemoryImage: %v", err)
		}
	}
	return img
}

func TestPauseResumeKeepsProcesses(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"sh", "-c", "echo kept > /workspace/file; echo tmp > /tmp/file"}})
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"sh", "-c", counterLoop}}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, c, "/tmp/counter")
	pid1, n1 := readCounter(t, c)

	img := pauseBox(t, d, id)
	names := imageNames(t, img)
	t.Logf("image: %d bytes, files %v", len(img), names)
	if names[0] != "meta.json" || !containsName(names, "checkpoint.img") {
		t.Fatalf("image files %v, want meta.json first and checkpoint.img", names)
	}
	if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
		t.Fatalf("Attach to a paused box: got %v, want ErrNotRunning", err)
	}

	start := time.Now()
	if err := d.Resume(ctxT(t), id, source(img)); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("resume took %v", time.Since(start))
	c = runtimetest.Client(t, d, id)
	pid2, n2 := readCounter(t, c)
	if pid2 != pid1 || n2 < n1 {
		t.Fatalf("after resume the loop is pid %d at %d, want pid %d at %d or more", pid2, n2, pid1, n1)
	}
	time.Sleep(200 * time.Millisecond)
	if pid3, n3 := readCounter(t, c); pid3 != pid1 || n3 <= n2 {
		t.Fatalf("the loop does not go on counting after resume: pid %d at %d, then %d", pid3, n2, n3)
	}
	res := runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"cat", "/workspace/file", "/tmp/file"}})
	if string(res.Stdout) != "kept\ntmp\n" {
		t.Fatalf("files after resume: %q", res.Stdout)
	}
	// The restored init pays its first clone's cost in the background (Server.Warm), not in
	// the first exec after the resume.
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(d.BoxLog(id), "exec starts warmed up after a restore"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the restored init did not warm up its exec starts within 20 s; its log ends: %s", d.BoxLog(id))
		}
	}

	// A second pause and resume of the same box, from the driver's kept copy, whose image
	// was read twice (a store retried after a crash): the second read is runsc's files only,
	// and the sums it writes still fit the kept copy.
	pauseBoxKeeping(t, d, id, true)
	rc, err := d.MemoryImage(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	again, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if names := imageNames(t, again); containsName(names, "sums.json") {
		t.Fatalf("the image read again holds %v, want runsc's files only", names)
	}
	start = time.Now()
	if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
		t.Fatalf("second Resume: %v", err)
	}
	t.Logf("resume from the kept copy took %v", time.Since(start))
	c = runtimetest.Client(t, d, id)
	if pid4, _ := readCounter(t, c); pid4 != pid1 {
		t.Fatalf("after a second pause the loop is pid %d, want %d", pid4, pid1)
	}
	// A kept copy that changed since it was streamed is not used: the stored one is.
	img = pauseBoxKeeping(t, d, id, true)
	pages := filepath.Join(stateDirOf(t, d), "boxes", id, "memory", "pages.img")
	data, err := os.ReadFile(pages)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(pages, data, 0o600); err != nil {
		t.Fatal(err)
	}
	opened := false
	if err := d.Resume(ctxT(t), id, func(ctx context.Context) (io.ReadCloser, error) {
		opened = true
		return source(img)(ctx)
	}); err != nil || !opened {
		t.Fatalf("Resume with a changed kept copy: %v (stored copy opened: %v), want the stored copy used", err, opened)
	}
	c = runtimetest.Client(t, d, id)
	if pid5, _ := readCounter(t, c); pid5 != pid1 {
		t.Fatalf("after a resume from the stored copy the loop is pid %d, want %d", pid5, pid1)
	}

	// A server that died after runsc saved the box, before it named the folder: its shell
	// marked memory.new complete. The pause that finishes it (the box no longer runs) names it
	// memory, and a resume from that kept copy brings the loop back.
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	boxDir := filepath.Join(stateDirOf(t, d), "boxes", id)
	if err := os.Rename(filepath.Join(boxDir, "memory"), filepath.Join(boxDir, "memory.new")); err != nil {
		t.Fatal(err)
	}
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause of a box whose marked image is in memory.new: %v, want it taken as paused", err)
	}
	if _, err := os.Stat(filepath.Join(boxDir, "memory", "meta.json")); err != nil {
		t.Fatalf("the marked image was not named memory: %v", err)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
		t.Fatalf("Resume from the settled image: %v", err)
	}
	c = runtimetest.Client(t, d, id)
	if pid6, _ := readCounter(t, c); pid6 != pid1 {
		t.Fatalf("after a resume from the settled image the loop is pid %d, want %d", pid6, pid1)
	}
}

func imageNames(t *testing.T, img []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("image archive: %v", err)
		}
		names = append(names, h.Name)
	}
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func TestPauseRefusesWorkspaceSocket(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	// A process holding a unix socket bound in the workspace (a host folder) cannot be saved.
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"python3", "-c",
		"import socket,time; s=socket.socket(socket.AF_UNIX); s.bind('/workspace/app.sock'); s.listen(); open('/tmp/ready','w').close(); time.sleep(600)"}}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, c, "/tmp/ready")
	err := d.Pause(ctxT(t), id)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Code != proto.ErrCodeState || !strings.Contains(pe.Message, "/workspace/app.sock") {
		t.Fatalf("Pause with a socket bound in the workspace: got %v, want the guest's invalid_state naming it", err)
	}
	// The box runs on, reachable as before.
	if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseRunning {
		t.Fatalf("after the refused pause the box is %s", b.Phase)
	}
	c = runtimetest.Client(t, d, id)
	runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}})
	if _, err := d.MemoryImage(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("MemoryImage after a refused pause: got %v, want ErrNotFound", err)
	}
}

func waitFile(t *testing.T, c *client.Client, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res := runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"test", "-e", path}})
		if res.Exit.ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestResumeRefusesBadImages(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"sh", "-c", "echo kept > /workspace/file"}})
	img := pauseBox(t, d, id)

	for _, tc := range []struct {
		name    string
		image   []byte
		corrupt bool
		want    string
	}{
		{"NotTar", []byte("not an archive at all, but long enough to be read as a header? no"), true, "could not be read"},
		{"Truncated", img[:len(img)/2], true, "could not be read"},
		{"Traversal", tarOf(t, map[string]string{"../escape.img": "x"}), true, "unexpected entry"},
		{"Symlink", symlinkTar(t), true, "unexpected entry"},
		{"NoMeta", tarOf(t, map[string]string{"checkpoint.img": "x"}), true, "incomplete"},
		{"OtherBox", withMeta(t, img, `"box": "`+id+`"`, `"box": "sbx_someoneelse"`), true, "another sandbox"},
		{"OtherRunsc", withMeta(t, img, `"runsc_sha256": "`, `"runsc_sha256": "00`), false, "another runsc"},
		{"OtherHost", withMeta(t, img, `"host": "`, `"host": "elsewhere-`), false, "another host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Resume(ctxT(t), id, source(tc.image))
			var ie *runtime.ImageError
			if !errors.As(err, &ie) || ie.Corrupt != tc.corrupt || !strings.Contains(ie.Reason, tc.want) {
				t.Fatalf("got %v (%+v), want an ImageError (corrupt %v) saying %q", err, ie, tc.corrupt, tc.want)
			}
			if b, _ := d.Get(ctxT(t), id); b.Phase != runtime.PhaseStopped {
				t.Fatalf("after a refused image the box is %s, want stopped", b.Phase)
			}
			if _, err := os.Stat(filepath.Join(stateDirOf(t, d), "boxes", id, "memory.restore")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused image left its folder: %v", err)
			}
		})
	}
	// The workspace is intact: a plain start brings it back (the processes are lost).
	if fresh, err := d.Start(ctxT(t), id); err != nil || fresh {
		t.Fatalf("Start after refused images: (%v, %v)", fresh, err)
	}
	c = runtimetest.Client(t, d, id)
	res := runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"cat", "/workspace/file"}})
	if string(res.Stdout) != "kept\n" {
		t.Fatalf("workspace after refused images: %q", res.Stdout)
	}
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	tw.Close()
	return buf.Bytes()
}

func symlinkTar(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "checkpoint.img", Linkname: "/etc/shadow", Typeflag: tar.TypeSymlink}); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

// withMeta rewrites the image's meta.json, replacing old with new.
func withMeta(t *testing.T, img []byte, old, new string) []byte {
	t.Helper()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if h.Name == "meta.json" {
			if !bytes.Contains(data, []byte(old)) {
				t.Fatalf("meta.json %s holds no %s", data, old)
			}
			data = bytes.Replace(data, []byte(old), []byte(new), 1)
			h.Size = int64(len(data))
		}
		tw.WriteHeader(h)
		tw.Write(data)
	}
	tw.Close()
	return out.Bytes()
}

// A pause returns once the checkpoint has stopped the box's kernel for good; what runsc keeps of
// the container is deleted in the background, and whatever comes next (a stop, a resume, a
// delete) waits for that deletion instead of meeting a container half deleted. The deletion is
// held for the pause's record write (TestPauseTeardownWaitsForTheRecord); a resume or delete
// lets it go at once: the hold here outlasts the calls' contexts.
func TestPauseEndsTheBoxThenDeletesItsContainer(t *testing.T) {
	d := newDriver(t)
	d.SetTeardownHold(10 * time.Minute)
	id, c, pid1 := boxWithCounter(t, d)

	for round := range 3 {
		pauseUntilGone(t, d, id)
		if b, err := d.Get(ctxT(t), id); err != nil || b.Phase != runtime.PhaseStopped {
			t.Fatalf("round %d: right after Pause the box is %s (%s, %v), want stopped", round, b.Phase, b.Reason, err)
		}
		switch round {
		case 0, 1:
			if round == 0 {
				if err := d.Stop(ctxT(t), id); err != nil {
					t.Fatalf("Stop after Pause: %v", err)
				}
			}
			// Round 1 resumes without a stop between (a pause whose stop was cut short).
			if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
				t.Fatalf("round %d: Resume straight after Pause: %v", round, err)
			}
			c = runtimetest.Client(t, d, id)
			if pid, _ := readCounter(t, c); pid != pid1 {
				t.Fatalf("round %d: after resume the loop is pid %d, want %d", round, pid, pid1)
			}
		case 2:
			// A delete straight after the pause: nothing is left behind (newDriver's cleanup
			// checks runsc's containers and the mounts).
			if err := d.Delete(ctxT(t), id); err != nil {
				t.Fatalf("Delete straight after Pause: %v", err)
			}
			out, err := exec.Command(components.runsc, "--root="+d.RootDir(), "list", "-quiet").Output()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Fatalf("containers after Delete: %q, %v", out, err)
			}
		}
	}
}

// A pause's container deletion waits for the pause to be recorded (the box's next record
// write), so that its `runsc delete` does not share the host with the pause's last steps. The
// box's compute is gone meanwhile. What else lets it go (a resume, a delete) is
// TestPauseEndsTheBoxThenDeletesItsContainer.
func TestPauseTeardownWaitsForTheRecord(t *testing.T) {
	d := newDriver(t)
	d.SetTeardownHold(10 * time.Minute) // longer than any step below may take
	id, _, _ := boxWithCounter(t, d)
	kept := func() bool {
		t.Helper()
		ok, err := d.ContainerKept(ctxT(t), id)
		if err != nil {
			t.Fatalf("ContainerKept: %v", err)
		}
		return ok
	}

	pauseUntilGone(t, d, id) // its compute is gone, though its deletion is held
	if !kept() {
		t.Fatal("the container was deleted before the pause was recorded")
	}
	if _, err := d.UpdateRecord(ctxT(t), id, func(*runtime.Record) error { return nil }); err != nil {
		t.Fatalf("UpdateRecord: %v", err)
	}
	for deadline := time.Now().Add(20 * time.Second); kept(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("runsc still keeps the container 20 s after the record write")
		}
	}
}

// pauseUntilGone pauses box id and waits until its sandbox process has left the host: the
// checkpoint stopped the box's kernel for good, and its sandbox process exits by itself (or is
// killed by the background deletion) without any other call, within 5 s.
func pauseUntilGone(t *testing.T, d *gvisor.Driver, id string) {
	t.Helper()
	spid, err := d.SandboxPid(ctxT(t), id)
	if err != nil || spid <= 0 {
		t.Fatalf("SandboxPid: %d, %v", spid, err)
	}
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); hostProcessRuns(spid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox process %d still runs 5 s after Pause returned", spid)
		}
	}
}

// boxWithCounter creates a box running counterLoop and returns it, an attach to it and the
// loop's pid.
func boxWithCounter(t *testing.T, d *gvisor.Driver) (string, *client.Client, int) {
	t.Helper()
	id := runtimetest.CreateBox(t, d, defaultSpec())
	c := runtimetest.Client(t, d, id)
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"sh", "-c", counterLoop}}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, c, "/tmp/counter")
	pid, _ := readCounter(t, c)
	return id, c, pid
}

// hostProcessRuns reports whether pid is a live process on the host (not gone, not a zombie).
func hostProcessRuns(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A pause quiesces the guest init over the caller's attach when the context carries one
// (runtime.WithQuiesce), else over the spare attach of the box's last resume, else over a
// stream of its own (also when the caller's attach fails); the guest's refusal over the
// caller's attach is the pause's answer.
func TestPauseQuiescesOverTheCallersAttach(t *testing.T) {
	d := newDriver(t)
	id, c, pid1 := boxWithCounter(t, d)

	pauseWith := func(c *client.Client, fail error) (called bool) {
		t.Helper()
		ctx := runtime.WithQuiesce(ctxT(t), func(ctx context.Context) error {
			called = true
			defer c.Close()
			if fail != nil {
				return fail
			}
			_, err := c.Quiesce(ctx)
			return err
		})
		if err := d.Pause(ctx, id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
		if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		return called
	}
	// Over the caller's attach.
	if !pauseWith(c, nil) {
		t.Fatal("the driver did not quiesce over the caller's attach")
	}
	c = runtimetest.Client(t, d, id)
	if pid, _ := readCounter(t, c); pid != pid1 {
		t.Fatalf("after the pause the loop is pid %d, want %d", pid, pid1)
	}
	// The caller's attach broken: the driver's own stream.
	if !pauseWith(c, client.ErrClosed) {
		t.Fatal("the driver did not try the caller's attach")
	}
	// Straight after that resume, no attach taken: over the spare attach the resume kept.
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause right after a resume: %v", err)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	c = runtimetest.Client(t, d, id)
	if pid, _ := readCounter(t, c); pid != pid1 {
		t.Fatalf("after the third pause the loop is pid %d, want %d", pid, pid1)
	}
	// The guest refuses over the caller's attach: that is the answer, and the box runs on.
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"python3", "-c",
		"import socket,time; s=socket.socket(socket.AF_UNIX); s.bind('/workspace/app.sock'); s.listen(); open('/tmp/ready','w').close(); time.sleep(600)"}}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, c, "/tmp/ready")
	err := d.Pause(runtime.WithQuiesce(ctxT(t), func(ctx context.Context) error {
		_, err := c.Quiesce(ctx)
		return err
	}), id)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Code != proto.ErrCodeState {
		t.Fatalf("Pause refused over the caller's attach: got %v, want the guest's invalid_state", err)
	}
	runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}})
}

// savedKernelState pauses box id, returns the size of its checkpoint.img (the box's kernel
// state a pause saves) and resumes it from that image.
func savedKernelState(t *testing.T, d *gvisor.Driver, id string) int64 {
	t.Helper()
	if err := d.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	fi, err := os.Stat(filepath.Join(stateDirOf(t, d), "boxes", id, "memory", "checkpoint.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	return fi.Size()
}

// savedStatePerExec measures what n execs, each run by exec over an attach of box id, add to
// the box's saved kernel state (savedKernelState): the size before and after them (after one
// exec of `true` first), and the growth per exec.
func savedStatePerExec(t *testing.T, d *gvisor.Driver, id string, n int, exec func(c *client.Client)) (before, after, per int64) {
	t.Helper()
	c := runtimetest.Client(t, d, id)
	runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}})
	before = savedKernelState(t, d, id)
	c = runtimetest.Client(t, d, id) // the pause broke the attach
	for range n {
		exec(c)
	}
	after = savedKernelState(t, d, id)
	return before, after, (after - before) / int64(n)
}

// TestFailedStartsLeaveNoCgroup: a start that fails after its exec's cgroup was made (a working
// folder that does not exist, found by the child's chdir) gives the cgroup back at once, like
// an exec that ran and ended: each such exec adds its log's file to the box's saved kernel
// state, not a cgroup (about 1.7 KiB more).
func TestFailedStartsLeaveNoCgroup(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	const n = 100
	before, after, per := savedStatePerExec(t, d, id, n, func(c *client.Client) {
		res := runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}, Cwd: "/no/such/folder"})
		if res.Exit.ExitCode != 127 || !strings.Contains(res.Exit.Error, "cd: /no/such/folder") {
			t.Fatalf("a start in a missing folder: %+v, want 127 and the cd error", res.Exit)
		}
	})
	t.Logf("checkpoint.img: %d bytes, then %d after %d failed starts: %d bytes per exec", before, after, n, per)
	if per > 800 {
		t.Errorf("each failed start adds %d bytes to the box's saved kernel state, want at most 800 (no cgroup kept)", per)
	}
}

// TestPauseImageGrowsLittlePerExec: what the guest init keeps of each ended exec is state of
// the box's kernel, which every pause saves and every resume restores. A cgroup per exec (kept
// until the exec was forgotten, and some of it by gVisor even after), a status file and a
// folder per exec made it about 2.2 KiB of checkpoint.img per exec; an exec that ended with
// nothing left running now leaves its log's file, about 430 bytes.
func TestPauseImageGrowsLittlePerExec(t *testing.T) {
	d := newDriver(t)
	id := runtimetest.CreateBox(t, d, defaultSpec())
	const n = 100
	before, after, per := savedStatePerExec(t, d, id, n, func(c *client.Client) {
		runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"true"}})
	})
	t.Logf("checkpoint.img: %d bytes, then %d after %d more execs: %d bytes per exec", before, after, n, per)
	if per > 600 {
		t.Errorf("each ended exec adds %d bytes to the box's saved kernel state, want at most 600", per)
	}

	// Nor does each pause and resume: a restored init warms up its exec starts (Server.Warm),
	// in a recycled cgroup, never in one it makes and removes each time.
	const warmed = "exec starts warmed up after a restore"
	waitWarm := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); strings.Count(d.BoxLog(id), warmed) < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the restored init did not warm up %d times within 20 s", want)
			}
		}
	}
	// The typical cycle's growth (the median of the cycles'), not the mean: a leak grows the
	// state in every cycle, while a one-time growth does not (on a loaded host the restored
	// init's Go runtime may start one more thread, a task of some 5 KB, in any one cycle: once
	// 669 bytes per cycle on average against 34-76 in other runs).
	waitWarm(2)
	sizes := []int64{savedKernelState(t, d, id)}
	const cycles = 8
	for i := range cycles {
		waitWarm(3 + i)
		sizes = append(sizes, savedKernelState(t, d, id))
	}
	growth := make([]int64, cycles)
	for i := range growth {
		growth[i] = sizes[i+1] - sizes[i]
	}
	slices.Sort(growth)
	median := (growth[cycles/2-1] + growth[cycles/2]) / 2
	t.Logf("checkpoint.img: %d bytes, then %d after %d more pauses and resumes: %d bytes per cycle on average, the median cycle %d (each: %v)",
		sizes[0], sizes[cycles], cycles, (sizes[cycles]-sizes[0])/cycles, median, growth)
	if median > 300 {
		t.Errorf("each pause and resume adds %d bytes to the box's saved kernel state (the median cycle), want at most 300", median)
	}
}
