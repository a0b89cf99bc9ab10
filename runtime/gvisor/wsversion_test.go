package gvisor_test

import (
	"os"
	"path/filepath"
	"testing"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime/gvisor"
	"sandboxd/runtime/runtimetest"
)

// A paused box's workspace version stays the same while nothing changes in it, across pauses,
// resumes, the stop of a paused box and commands that only write outside /workspace; any
// change in the workspace moves it: a box's write read back at once (still in the host's page
// cache when the version is read), a mode alone, a host-side write, a new mount of the disk.
func TestWorkspaceVersion(t *testing.T) {
	d := newDriver(t)
	id, c, _ := boxWithCounter(t, d) // it writes /tmp every 20 ms, never /workspace
	if v, _, err := d.WorkspaceVersion(ctxT(t), id, "", false); err == nil && v == "" {
		t.Skip("this host has no workspace versions (a kernel before 6.8, or a loop device without I/O statistics): every pause checkpoints")
	}
	run := func(c *client.Client, script string) {
		t.Helper()
		runtimetest.MustRun(t, c, proto.ExecRequest{ID: runtimetest.NewExecID(), Argv: []string{"sh", "-c", script}})
	}
	run(c, "echo one > /workspace/f")
	version := func(since string, settle bool) (string, bool) {
		t.Helper()
		v, same, err := d.WorkspaceVersion(ctxT(t), id, since, settle)
		if err != nil || v == "" {
			t.Fatalf("WorkspaceVersion: %q, %v", v, err)
		}
		return v, same
	}
	// pauseAnd pauses the box, reads its version against since and then settled, stops and
	// resumes it.
	pauseAnd := func(since string) (v string, same bool, settled string) {
		t.Helper()
		if err := d.Pause(ctxT(t), id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		v, same = version(since, false)
		settled, _ = version("", true)
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
		if err := d.Resume(ctxT(t), id, noSource(t)); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		c = runtimetest.Client(t, d, id)
		return v, same, settled
	}

	_, same, v1 := pauseAnd("")
	if same {
		t.Fatal("a version is unchanged since nothing")
	}
	if v2, same, _ := pauseAnd(v1); !same || v2 != v1 {
		t.Fatalf("an idle box's settled version moved across a resume and a pause: %s then %s", v1, v2)
	}
	if _, same := version(v1, false); !same {
		t.Fatal("the version of a running box that wrote nothing moved")
	}

	// Each change is read back at once: in the host's page cache when the version is read.
	for _, change := range []struct{ name, script string }{
		{"a write read back at once", "echo two > /workspace/f; cat /workspace/f"},
		{"a new empty file", "touch /workspace/g"},
		{"a mode", "chmod 600 /workspace/f"},
		{"a rename", "mv /workspace/g /workspace/h"},
		{"a removal", "rm /workspace/h"},
	} {
		run(c, change.script)
		v, same, settled := pauseAnd(v1)
		if same || v == v1 {
			t.Fatalf("%s: the version did not move (%s)", change.name, v)
		}
		v1 = settled
	}

	// A write on the host side, into the page cache only.
	ws := filepath.Join(stateDirOf(t, d), "boxes", id, "disk", "workspace")
	if err := os.WriteFile(filepath.Join(ws, "host"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, same := version(v1, false); same || v == v1 {
		t.Fatalf("a host-side write: the version did not move (%s)", v)
	}

	// A new mount of the same disk never matches an earlier one's version: a driver whose
	// stops unmount (no kept mounts) mounts the disk afresh for the resume.
	d2 := newDriverWith(t, gvisor.Options{KeptMounts: -1})
	id2 := runtimetest.CreateBox(t, d2, defaultSpec())
	if err := d2.Pause(ctxT(t), id2); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	before, _, err := d2.WorkspaceVersion(ctxT(t), id2, "", false)
	if err != nil || before == "" {
		t.Fatalf("WorkspaceVersion: %q, %v", before, err)
	}
	if err := d2.Stop(ctxT(t), id2); err != nil {
		t.Fatal(err)
	}
	if v, same, err := d2.WorkspaceVersion(ctxT(t), id2, before, false); err != nil || v != "" || same {
		t.Fatalf("the version of an unmounted disk: %q, %v, %v; want none", v, same, err)
	}
	if err := d2.Resume(ctxT(t), id2, noSource(t)); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := d2.Pause(ctxT(t), id2); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if v, same, err := d2.WorkspaceVersion(ctxT(t), id2, before, false); err != nil || same || v == before {
		t.Fatalf("after a new mount: %q, %v, %v; want another version", v, same, err)
	}
	if err := d2.Delete(ctxT(t), id2); err != nil {
		t.Fatal(err)
	}
}
