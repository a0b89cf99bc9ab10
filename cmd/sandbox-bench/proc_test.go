package main

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

const smapsRollupSample = `00400000-7ffc0fb10000 ---p 00000000 00:00 0                              [rollup]
Rss:               38608 kB
Pss:               13348 kB
Pss_Dirty:          8283 kB
Pss_Anon:           7451 kB
Pss_File:           5042 kB
Shared_Clean:      29484 kB
Swap:                  0 kB
SwapPss:               0 kB
`

func TestKBFields(t *testing.T) {
	if got, err := pssOf([]byte(smapsRollupSample)); err != nil || got != 13348<<10 {
		t.Errorf("pssOf = %d, %v; want %d (Pss, not Pss_Dirty or SwapPss)", got, err, 13348<<10)
	}
	status := "Name:\truntime\nVmPeak:\t 2414428 kB\nVmRSS:\t  130980 kB\nRssAnon:\t   90000 kB\nThreads:\t12\n"
	if got, err := rssOf([]byte(status)); err != nil || got != 130980<<10 {
		t.Errorf("rssOf = %d, %v; want %d", got, err, 130980<<10)
	}
	for _, tc := range []struct {
		name, data string
	}{
		{"missing", "Rss: 12 kB\n"},
		{"zombie-empty", ""},
		{"not-a-number", "Pss: x kB\n"},
		{"other-unit", "Pss: 12 MB\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := pssOf([]byte(tc.data)); err == nil {
				t.Errorf("pssOf(%q) = %d, nil; want an error", tc.data, got)
			}
		})
	}
}

func TestMetricValue(t *testing.T) {
	text := "# HELP go_goroutines Number of goroutines that currently exist.\n" +
		"# TYPE go_goroutines gauge\n" +
		"go_goroutines_total_fake 7\n" +
		"go_goroutines 1042\n" +
		"go_threads 14\n"
	if got, ok := metricValue(text, "go_goroutines"); !ok || got != 1042 {
		t.Errorf("go_goroutines = %v, %v; want 1042, true", got, ok)
	}
	if got, ok := metricValue(text, "go_memstats_alloc_bytes"); ok {
		t.Errorf("absent metric = %v, true; want false", got)
	}
	if got, ok := metricValue("go_goroutines NaNx\n", "go_goroutines"); ok {
		t.Errorf("malformed value = %v, true; want false", got)
	}
}

func TestMentions(t *testing.T) {
	const id = "sbx_01M8PPTJM6N7G9K68BMT1XGGW1"
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"container-id-argument", []string{"runsc-sandbox", "--root=/s/runsc-root", "boot", id}, true},
		{"bundle-path", []string{"runsc-gofer", "gofer", "--bundle", "/s/boxes/" + id + "/bundle"}, true},
		{"flag-value", []string{"runsc", "--bundle=/s/boxes/" + id}, true},
		{"longer-id", []string{"runsc", "boot", id + "X"}, false},
		{"id-suffix-of-another", []string{"runsc", "boot", "x" + id}, false},
		{"second-occurrence-counts", []string{"runsc", id + "X/" + id}, true},
		{"other-box", []string{"runsc-sandbox", "boot", "sbx_01M8PPTNMGNKRNJX1XJ9DMY4JC"}, false},
		{"no-args", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mentions(tc.args, id); got != tc.want {
				t.Errorf("mentions(%q) = %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}

func TestBoxProcs(t *testing.T) {
	const id = "sbx_A"
	procs := []proc{
		{pid: 1, ppid: 0, args: []string{"init"}},
		{pid: 10, ppid: 1, args: []string{"sandboxd"}},
		{pid: 20, ppid: 1, args: []string{"runsc-gofer", "gofer", "--bundle", "/s/boxes/sbx_A/bundle", "sbx_A"}},
		{pid: 21, ppid: 1, args: []string{"runsc-sandbox", "boot", "sbx_A"}},
		{pid: 22, ppid: 21, args: []string{""}},
		{pid: 23, ppid: 22, args: []string{""}},
		{pid: 24, ppid: 22, args: []string{""}},
		{pid: 30, ppid: 1, args: []string{"runsc-sandbox", "boot", "sbx_AB"}},
		{pid: 31, ppid: 30, args: []string{""}},
	}
	if got, want := boxProcs(procs, id), []int{20, 21, 22, 23, 24}; !slices.Equal(got, want) {
		t.Errorf("boxProcs = %v, want %v", got, want)
	}
	if got := boxProcs(procs, "sbx_none"); len(got) != 0 {
		t.Errorf("boxProcs of an absent id = %v, want none", got)
	}
	byPid := map[int]proc{}
	for _, p := range procs {
		byPid[p.pid] = p
	}
	in := map[int]bool{20: true, 21: true, 22: true, 23: true, 24: true}
	for pid, want := range map[int]int{23: 21, 22: 21, 21: 21, 20: 20} {
		if got := rootOf(byPid, in, pid); got != want {
			t.Errorf("rootOf(%d) = %d, want %d", pid, got, want)
		}
	}
}

func TestGroupBy(t *testing.T) {
	// 22, 23 and 24 share an address space (systrap stubs); 21 and 20 are alone.
	mm := map[int]int{20: 1, 21: 2, 22: 3, 23: 3, 24: 3}
	same := func(a, b int) (bool, error) { return mm[a] == mm[b], nil }
	got, err := groupBy([]int{20, 21, 22, 23, 24}, same)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{20}, {21}, {22, 23, 24}}
	if !slices.EqualFunc(got, want, slices.Equal[[]int]) {
		t.Errorf("groupBy = %v, want %v", got, want)
	}
	boom := errors.New("boom")
	if _, err := groupBy([]int{1, 2}, func(int, int) (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Errorf("groupBy error = %v, want %v", err, boom)
	}
}

func TestChildNamed(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid, err := childNamed(os.Getpid(), "sleep")
	if err != nil || pid != cmd.Process.Pid {
		t.Fatalf("childNamed(self, sleep) = %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
	if _, err := childNamed(os.Getpid(), "no-such-command"); err == nil {
		t.Fatal("childNamed found a child that does not exist")
	}
}

func TestCgroupCPUFiles(t *testing.T) {
	for _, c := range []struct {
		name, data string
		want       []string
	}{
		{"v1", "9:pids:/sbx_1\n3:cpuset:/sbx_1\n2:cpuacct:/sbx_1\n1:cpu:/sbx_1\n0::/\n", []string{
			"/sys/fs/cgroup/cpuacct/sbx_1/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/sbx_1/cpuacct.usage",
			"/sys/fs/cgroup/cpuacct,cpu/sbx_1/cpuacct.usage"}},
		{"v1 joined", "4:cpu,cpuacct:/a/b\n", []string{
			"/sys/fs/cgroup/cpuacct/a/b/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/a/b/cpuacct.usage",
			"/sys/fs/cgroup/cpuacct,cpu/a/b/cpuacct.usage"}},
		{"v2", "0::/sbx_1\n", []string{"/sys/fs/cgroup/sbx_1/cpu.stat", "/sys/fs/cgroup/unified/sbx_1/cpu.stat"}},
		{"the root, shared with the host", "2:cpuacct:/\n0::/\n", nil},
		{"nothing", "", nil},
	} {
		if got := cgroupCPUFiles([]byte(c.data)); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestParseCgroupCPU(t *testing.T) {
	if d, err := parseCgroupCPU("cpuacct.usage", []byte("563169080\n")); err != nil || d != 563169080 {
		t.Errorf("cpuacct.usage: %v, %v", d, err)
	}
	stat := "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n"
	if d, err := parseCgroupCPU("cpu.stat", []byte(stat)); err != nil || d != 1500*time.Microsecond {
		t.Errorf("cpu.stat: %v, %v", d, err)
	}
	for name, data := range map[string]string{"cpu.stat": "user_usec 1\n", "cpuacct.usage": "x\n"} {
		if _, err := parseCgroupCPU(name, []byte(data)); err == nil {
			t.Errorf("%s %q: no error", name, data)
		}
	}
}
