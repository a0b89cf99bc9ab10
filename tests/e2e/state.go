package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// StateDir is a sandboxd state folder and checkpoint folder; replicas and restarts share one.
type StateDir struct {
	Dir         string
	Checkpoints string
}

// NewStateDir makes a state folder. When the test ends (after every server on it stopped) no
// runsc container, mount or loop device may be left in it: one that is, is an error and is
// removed.
func NewStateDir(t *testing.T) *StateDir {
	t.Helper()
	RequireComponents(t)
	dir, err := os.MkdirTemp(suite.root, "state-")
	if err != nil {
		t.Fatal(err)
	}
	suite.mu.Lock()
	suite.stateDirs = append(suite.stateDirs, dir)
	suite.mu.Unlock()
	sd := &StateDir{Dir: dir, Checkpoints: filepath.Join(dir, "checkpoints")}
	t.Cleanup(func() {
		ids, err := LeftoverContainers(dir)
		if err != nil {
			t.Errorf("checking for leftover containers: %v", err)
			return
		}
		if len(ids) > 0 {
			t.Errorf("got runsc containers %v left in %s after the test, want none (every sandbox is destroyed)", ids, runscRoot(dir))
			forceDelete(dir, ids)
		}
		// A stopped server's state folder can be removed: no mount (runsc's null-netns, a
		// sandbox's disk) and no loop device is left in it.
		if m, l := MountsUnder(dir), LoopsBacking(dir); len(m) > 0 || len(l) > 0 {
			t.Errorf("got mounts %q and loop devices %q left under %s after every server on it stopped, want none (rm -rf of the folder fails with EBUSY)", m, l, dir)
			unmountUnder(dir)
		}
	})
	return sd
}

// MountsUnder lists the mount points at or below dir (/proc/self/mountinfo).
func MountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"reading mountinfo: " + err.Error()}
	}
	var found []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			found = append(found, f[4])
		}
	}
	return found
}

// LoopsBacking lists the loop devices whose backing file lies under dir.
func LoopsBacking(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var found []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if p := strings.TrimSpace(string(b)); strings.HasPrefix(p, dir+"/") {
			found = append(found, filepath.Base(filepath.Dir(filepath.Dir(f)))+"="+p)
		}
	}
	return found
}
