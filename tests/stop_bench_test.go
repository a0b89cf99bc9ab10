package tests

import (
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
// workspace checkpoint, then the compute released) and a REST start of a sandbox holding the
// same 100 MB, 6,000-file workspace on the kube runtime (the test cluster) and on the local
// runtime, round by round:
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
	l := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"profiles": []map[string]any{{"name": "sandboxes-default",
		"rootfs": e2e.Rootfs(), "milli_cpu": 2000, "memory_mb": 1024, "disk_mb": 2048}}}})
	type side struct {
		name        string
		s           *e2e.Server
		id          string
		stop, start []time.Duration
	}
	sides := []*side{{name: "kube", s: k}, {name: "local", s: l}}
	for _, sd := range sides {
		sd.id = sd.s.Create(t, `{"profile":"sandboxes-default","autostop_sec":3600}`, e2e.HdrDev).SandboxID
		sd.s.Run(t, sd.id, append([]string{"python3", "-c", benchws.Script}, benchws.Args...), e2e.HdrDev)
		if got := sd.s.Run(t, sd.id, []string{"sh", "-c", "find /workspace -type f | wc -l"}, e2e.HdrDev); strings.TrimSpace(got) != "6000" {
			t.Fatalf("%s: the workspace holds %s files, want 6000", sd.name, got)
		}
	}
	for range rounds {
		for _, sd := range sides {
			t0 := time.Now()
			sd.s.Curl(t, http.MethodPost, e2e.Prefix+"/"+sd.id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
			sd.stop = append(sd.stop, time.Since(t0))
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
	kube, local := sides[0], sides[1]
	t.Logf("100 MB, 6,000 files, %d rounds, alternating:\n"+
		"| what | kube | local | kube / local |\n| --- | ---: | ---: | ---: |\n"+
		"| REST stop (median) | %v | %v | %.2f× |\n| REST start (median) | %v | %v | %.2f× |\n"+
		"kube stops %v, starts %v; local stops %v, starts %v",
		rounds, med(kube.stop), med(local.stop), float64(med(kube.stop))/float64(med(local.stop)),
		med(kube.start), med(local.start), float64(med(kube.start))/float64(med(local.start)),
		kube.stop, kube.start, local.stop, local.start)
	for _, sd := range sides {
		for _, l := range sd.s.LogLines("workspace checkpointed") {
			t.Logf("%s: %s", sd.name, l)
		}
		for _, l := range sd.s.LogLines("sandbox stopped") {
			t.Logf("%s: %s", sd.name, l)
		}
		if got := sd.s.Run(t, sd.id, []string{"sh", "-c", "find /workspace -type f | wc -l"}, e2e.HdrDev); strings.TrimSpace(got) != "6000" {
			t.Errorf("%s after the rounds: %s files, want 6000", sd.name, got)
		}
	}
}
