package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeRunsc writes a stand-in for runsc into dir: it records its argv and its stdin in
// dir/ran (one line each), sleeps $FAKE_SLEEP seconds, prints $FAKE_ERR to stderr and exits
// with $FAKE_EXIT.
func fakeRunsc(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "runsc")
	script := `#!/bin/sh
echo "$*" > "` + dir + `/ran.tmp"
cat >> "` + dir + `/ran.tmp"
echo "stdin-end" >> "` + dir + `/ran.tmp"
mv "` + dir + `/ran.tmp" "` + dir + `/ran"
sleep "${FAKE_SLEEP:-0}"
[ -n "$FAKE_ERR" ] && echo "$FAKE_ERR" >&2
exit "${FAKE_EXIT:-0}"
`
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// startFakeShell starts a checkpoint shell of box sbx_a with fakeRunsc, into a fresh
// memory.new: it returns the fake's folder, the image's folder and the shell.
func startFakeShell(t *testing.T, flags []string, timeout time.Duration) (tmp, newDir string, cp *checkpointer) {
	t.Helper()
	tmp = t.TempDir()
	d := testDriverFor(t, fakeRunsc(t, tmp))
	newDir = filepath.Join(tmp, "memory.new")
	if err := os.Mkdir(newDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cp, err := d.startCheckpointer(context.Background(), "sbx_a", flags, newDir, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return tmp, newDir, cp
}

func testDriverFor(t *testing.T, runsc string) *Driver {
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "boxes", "sbx_a"), 0o700); err != nil {
		t.Fatal(err)
	}
	return &Driver{opts: Options{Runsc: runsc, StateDir: state}, boxes: &boxStore{dir: filepath.Join(state, "boxes")}}
}

// TestCheckpointShell: the shell runs runsc (its argv as given, stdin empty, not the go line)
// only once told to go, and marks the folder complete only when runsc succeeded; a failure
// carries runsc's stderr. A shell ended without its go runs nothing.
func TestCheckpointShell(t *testing.T) {
	t.Run("go", func(t *testing.T) {
		tmp, newDir, cp := startFakeShell(t, []string{"--root=/r"}, time.Minute)
		time.Sleep(100 * time.Millisecond)
		if _, err := os.Stat(filepath.Join(tmp, "ran")); err == nil {
			t.Fatal("runsc ran before the shell was told to go")
		}
		if err := cp.run(); err != nil {
			t.Fatalf("run: %v", err)
		}
		ran, _ := os.ReadFile(filepath.Join(tmp, "ran"))
		want := "--root=/r checkpoint --image-path=" + newDir + " sbx_a\nstdin-end\n"
		if string(ran) != want {
			t.Fatalf("runsc ran as %q, want %q", ran, want)
		}
		if _, err := os.Stat(filepath.Join(newDir, imageDoneFile)); err != nil {
			t.Fatalf("no completion mark after a checkpoint that succeeded: %v", err)
		}
	})
	t.Run("runsc fails", func(t *testing.T) {
		t.Setenv("FAKE_EXIT", "3")
		t.Setenv("FAKE_ERR", "encoding error: cannot save it")
		_, newDir, cp := startFakeShell(t, nil, time.Minute)
		err := cp.run()
		if err == nil || !strings.Contains(err.Error(), "encoding error: cannot save it") {
			t.Fatalf("run = %v, want runsc's error with its stderr", err)
		}
		if _, err := os.Stat(filepath.Join(newDir, imageDoneFile)); err == nil {
			t.Fatal("a failed checkpoint was marked complete")
		}
	})
	t.Run("abort", func(t *testing.T) {
		tmp, newDir, cp := startFakeShell(t, nil, time.Minute)
		cp.abort()
		if _, err := os.Stat(filepath.Join(tmp, "ran")); err == nil {
			t.Fatal("runsc ran after the shell was aborted")
		}
		if _, err := os.Stat(filepath.Join(newDir, imageDoneFile)); err == nil {
			t.Fatal("an aborted checkpoint was marked complete")
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t.Setenv("FAKE_SLEEP", "3")
		_, _, cp := startFakeShell(t, nil, 200*time.Millisecond)
		start := time.Now()
		if err := cp.run(); err == nil {
			t.Fatal("a checkpoint past its timeout succeeded")
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("run returned %v after its 200 ms timeout", took)
		}
	})
}

// checkpointShellHelperEnv makes the test binary a server that starts a checkpoint shell and
// either tells it to go or not, then waits to be killed (TestCheckpointShellOutlivesItsServer).
const checkpointShellHelperEnv = "GVISOR_CHECKPOINT_SHELL_HELPER"

func TestCheckpointShellHelperProcess(t *testing.T) {
	mode := os.Getenv(checkpointShellHelperEnv)
	if mode == "" {
		t.Skip("the helper of TestCheckpointShellOutlivesItsServer")
	}
	tmp := os.Getenv("HELPER_DIR")
	d := &Driver{opts: Options{Runsc: filepath.Join(tmp, "runsc")}}
	cp, err := d.startCheckpointer(context.Background(), "sbx_a", nil, filepath.Join(tmp, "memory.new"), time.Minute)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if mode == "go" {
		if _, err := cp.stdin.Write([]byte("go\n")); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

// TestCheckpointShellOutlivesItsServer: a server SIGKILLed after it told the shell to go leaves
// a shell that finishes the checkpoint and marks it complete; one killed before it said go
// leaves a shell that runs nothing.
func TestCheckpointShellOutlivesItsServer(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"go", "no go"} {
		t.Run(mode, func(t *testing.T) {
			tmp := t.TempDir()
			fakeRunsc(t, tmp)
			newDir := filepath.Join(tmp, "memory.new")
			if err := os.Mkdir(newDir, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(self, "-test.run=^TestCheckpointShellHelperProcess$")
			cmd.Env = append(os.Environ(), checkpointShellHelperEnv+"="+mode, "HELPER_DIR="+tmp, "FAKE_SLEEP=0.5")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, _ := out.Read(buf)
			if !strings.Contains(string(buf[:n]), "ready") {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("helper said %q", buf[:n])
			}
			// The server dies while runsc runs (it sleeps half a second), or before its go.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			mark := filepath.Join(newDir, imageDoneFile)
			if mode == "go" {
				deadline := time.Now().Add(20 * time.Second)
				for {
					if _, err := os.Stat(mark); err == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the shell of a killed server did not finish the checkpoint and mark it")
					}
					time.Sleep(20 * time.Millisecond)
				}
				if _, err := os.Stat(filepath.Join(tmp, "ran")); err != nil {
					t.Fatalf("runsc did not run: %v", err)
				}
				return
			}
			time.Sleep(time.Second)
			if _, err := os.Stat(filepath.Join(tmp, "ran")); err == nil {
				t.Fatal("the shell ran runsc although its server died before it said go")
			}
			if _, err := os.Stat(mark); err == nil {
				t.Fatal("a checkpoint never run was marked complete")
			}
		})
	}
}

// TestSettleImage: a complete image left in memory.new (marked) is named memory, replacing a
// folder there without meta.json; an unmarked one is not; a complete memory stays as it is.
func TestSettleImage(t *testing.T) {
	write := func(t *testing.T, dir string, names ...string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("marked", func(t *testing.T) {
		d := testDriverFor(t, "")
		write(t, d.boxes.boxPath("sbx_a", memoryNewDn), imageMetaFile, "pages.img", imageDoneFile)
		write(t, d.boxes.boxPath("sbx_a", memoryDn), "pages.img") // an earlier pause's, cut short
		ok, err := d.settleImage("sbx_a")
		if err != nil || !ok {
			t.Fatalf("settleImage = %v, %v; want true", ok, err)
		}
		if _, err := os.Stat(d.boxes.boxPath("sbx_a", memoryNewDn)); err == nil {
			t.Fatal("memory.new is still there")
		}
		if b, _ := os.ReadFile(filepath.Join(d.boxes.boxPath("sbx_a", memoryDn), "pages.img")); string(b) != "pages.img" {
			t.Fatalf("memory/pages.img holds %q, want the marked image's", b)
		}
	})
	t.Run("unmarked", func(t *testing.T) {
		d := testDriverFor(t, "")
		write(t, d.boxes.boxPath("sbx_a", memoryNewDn), imageMetaFile, "pages.img")
		ok, err := d.settleImage("sbx_a")
		if err != nil || ok {
			t.Fatalf("settleImage = %v, %v; want false", ok, err)
		}
		if _, err := os.Stat(d.boxes.boxPath("sbx_a", memoryDn)); err == nil {
			t.Fatal("an image cut short was named memory")
		}
	})
	t.Run("kept", func(t *testing.T) {
		d := testDriverFor(t, "")
		write(t, d.boxes.boxPath("sbx_a", memoryDn), imageMetaFile, "checkpoint.img")
		write(t, d.boxes.boxPath("sbx_a", memoryNewDn), imageMetaFile, imageDoneFile)
		ok, err := d.settleImage("sbx_a")
		if err != nil || !ok {
			t.Fatalf("settleImage = %v, %v; want true", ok, err)
		}
		if _, err := os.Stat(filepath.Join(d.boxes.boxPath("sbx_a", memoryDn), "checkpoint.img")); err != nil {
			t.Fatal("the complete kept image was replaced")
		}
	})
}
