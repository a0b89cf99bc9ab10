package main

import (
	"bytes"
	"errors"
	"os/exec"
	"testing"
	"time"
)

// runFloorScript runs floorArgv's command with python3 on this host, as the floor steps run it
// in a sandbox, and returns it the way the REST exec answers it.
func runFloorScript(t *testing.T, mode string, n int) execResult {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH (scripts/test.sh installs it)")
	}
	cmd := exec.Command(py, floorArgv(mode, n)[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	res := execResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.ExitCode = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestFloorScriptModes(t *testing.T) {
	for _, mode := range []string{floorWait, floorFirst} {
		t.Run(mode, func(t *testing.T) {
			res := runFloorScript(t, mode, 3)
			ds, err := floorTimings(res, 3)
			if err != nil {
				t.Fatalf("%v (stdout %q, stderr %q)", err, res.Stdout, res.Stderr)
			}
			for _, d := range ds {
				if d <= 0 || d > time.Minute {
					t.Errorf("a spawn took %v", d)
				}
			}
		})
	}
}

func TestFloorTimingsRefusesBadRuns(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  execResult
		n    int
	}{
		{"failed", execResult{ExitCode: 1, Stderr: "echo wrote b''"}, 1},
		{"not JSON", execResult{Stdout: "Traceback"}, 1},
		{"too few", execResult{Stdout: "[5]\n"}, 2},
		{"zero", execResult{Stdout: "[0]\n"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := floorTimings(tc.res, tc.n); err == nil {
				t.Error("accepted")
			}
		})
	}
	ds, err := floorTimings(execResult{Stdout: "[1500000, 2500000]\n"}, 2)
	if err != nil || len(ds) != 2 || ds[0] != 1500*time.Microsecond || ds[1] != 2500*time.Microsecond {
		t.Errorf("got %v, %v", ds, err)
	}
}

func TestFloorPerRound(t *testing.T) {
	for rounds, want := range map[int]int{30: 2, 50: 1, 100: 1, 10: 5, 7: 8, 1: 50, 0: 50} {
		if got := floorPerRound(rounds); got != want {
			t.Errorf("floorPerRound(%d) = %d, want %d", rounds, got, want)
		}
		if rounds > 0 && floorPerRound(rounds)*rounds < floorSpawns {
			t.Errorf("floorPerRound(%d) records fewer than %d spawns", rounds, floorSpawns)
		}
	}
}
