package tests

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/benchws"
	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestStopBench is a bench command, not a test: it runs only with SANDBOXD_STOP_BENCH=N
// (rounds) and prints a table, asserting nothing about time. It measures a REST stop (the
// workspace checkpoint and the compute released) and a REST start of a sandbox holding the
// same 100 MB, 6,000-file workspace on the kube runtime (the test cluster) through the guest,
// on the kube runtime with the workspace reader (the PVC read beside the stopped sandbox by a
// reader pod on the node's native runtime), and on the local runtime, round by round; and,
// for each, the host's CPU time per stop by process name (every part shares the host's cores):
//
//	SANDBOXD_STOP_BENCH=3 go test -run TestStopBench -v ./tests/
func TestStopBench(t *testing.T) {
	rounds := benchRounds(t, "SANDBOXD_STOP_BENCH")
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	rs := redistest.Start(t)
	kopts := kubeServerOptions(t, kubeconfig, rs.URL, e2e.NewStateDir(t))
	kopts.Extra["profiles"] = []map[string]any{{"name": "sandboxes-default", "image": kubetest.BaseImage, "image_has_init": true,
		"milli_cpu": 2000, "memory_mb": 1024, "disk_mb": 2048}}
	k := e2e.StartServer(t, kopts)
	ropts := withReader(kopts, kubetest.NativeRuntimeClass)
	ropts.State = e2e.NewStateDir(t)
	kr := e2e.StartServer(t, ropts)
	l := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"profiles": []map[string]any{{"name": "sandboxes-default",
		"rootfs": e2e.Rootfs(), "milli_cpu": 2000, "memory_mb": 1024, "disk_mb": 2048}}}})
	type side struct {
		name        string
		s           *e2e.Server
		id          string
		stop, start []time.Duration
		cpu         map[string]time.Duration // the host's, during its stops
	}
	sides := []*side{{name: "kube, through the guest", s: k}, {name: "kube, the reader beside it", s: kr}, {name: "local", s: l}}
	for _, sd := range sides {
		sd.cpu = map[string]time.Duration{}
		sd.id = sd.s.Create(t, `{"profile":"sandboxes-default","autostop_sec":3600}`, e2e.HdrDev).SandboxID
		sd.s.Run(t, sd.id, append([]string{"python3", "-c", benchws.Script}, benchws.Args...), e2e.HdrDev)
		if got := sd.s.Run(t, sd.id, []string{"sh", "-c", "find /workspace -type f | wc -l"}, e2e.HdrDev); strings.TrimSpace(got) != "6000" {
			t.Fatalf("%s: the workspace holds %s files, want 6000", sd.name, got)
		}
	}
	for range rounds {
		for _, sd := range sides {
			cpu, t0 := startCPUSampler(), time.Now()
			sd.s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sd.id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
			sd.stop = append(sd.stop, time.Since(t0))
			cpu.end(sd.cpu)
			if sb := sd.s.Get(t, sd.id, e2e.HdrDev); sb.StateReason != "" {
				t.Fatalf("%s: the stop took no checkpoint: %s", sd.name, sb.StateReason)
			}
			t0 = time.Now()
			sd.s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sd.id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
			sd.start = append(sd.start, time.Since(t0))
		}
	}
	med := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2].Round(time.Millisecond)
	}
	local := sides[len(sides)-1]
	table := fmt.Sprintf("100 MB, 6,000 files, %d rounds, alternating:\n"+
		"| what | REST stop (median) | against local | REST start (median) | against local |\n| --- | ---: | ---: | ---: | ---: |\n", rounds)
	for _, sd := range sides {
		table += fmt.Sprintf("| %s | %v | %.2f× | %v | %.2f× |\n", sd.name, med(sd.stop), float64(med(sd.stop))/float64(med(local.stop)),
			med(sd.start), float64(med(sd.start))/float64(med(local.start)))
	}
	for _, sd := range sides {
		table += fmt.Sprintf("%s: stops %v, starts %v\n", sd.name, sd.stop, sd.start)
	}
	for _, sd := range sides {
		table += fmt.Sprintf("%s, the host's CPU per stop: %s\n", sd.name, topCPU(sd.cpu, rounds, 8))
	}
	t.Log(table)
	for _, sd := range sides {
		for _, l := range append(sd.s.LogLines("workspace checkpointed"), sd.s.LogLines("reader running")...) {
			t.Logf("%s: %s", sd.name, l)
		}
		if got := sd.s.Run(t, sd.id, []string{"sh", "-c", "find /workspace -type f | wc -l"}, e2e.HdrDev); strings.TrimSpace(got) != "6000" {
			t.Errorf("%s after the rounds: %s files, want 6000", sd.name, got)
		}
	}
}
