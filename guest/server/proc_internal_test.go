package server

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func TestTreeMembers(t *testing.T) {
	const self = 50
	// pid 100 leads the exec's group; 101 is in it; 102 left the group (setsid) as 100's child;
	// 103 is 102's child; 104 left the group and was re-parented to PID 1 (a double fork);
	// 105 is someone else's; 106 is a zombie of the group; 107 is the server itself's child.
	procs := []procEntry{
		{pid: 1, ppid: 0, pgrp: 1},
		{pid: self, ppid: 1, pgrp: self},
		{pid: 100, ppid: self, pgrp: 100},
		{pid: 101, ppid: 100, pgrp: 100},
		{pid: 102, ppid: 100, pgrp: 102},
		{pid: 103, ppid: 102, pgrp: 102},
		{pid: 104, ppid: 1, pgrp: 104},
		{pid: 105, ppid: 1, pgrp: 105},
		{pid: 106, ppid: 101, pgrp: 100, zombie: true},
		{pid: 107, ppid: self, pgrp: 107},
	}
	// After the main process (100) ended: its group lives on in 101; 102 and 103 were
	// re-parented to PID 1 when 100 exited.
	ended := []procEntry{
		{pid: 1, ppid: 0, pgrp: 1},
		{pid: 101, ppid: 1, pgrp: 100},
		{pid: 108, ppid: 101, pgrp: 108}, // 101's child that left the group
		{pid: 102, ppid: 1, pgrp: 102},
	}
	// The group died out and a new process got its number.
	reused := []procEntry{
		{pid: 1, ppid: 0, pgrp: 1},
		{pid: 100, ppid: 1, pgrp: 100},
		{pid: 101, ppid: 100, pgrp: 100},
	}
	tests := []struct {
		name    string
		procs   []procEntry
		running bool
		want    []int
	}{
		{"running", procs, true, []int{100, 101, 102, 103}},
		{"ended", ended, false, []int{101, 108}},
		{"ended-number-reused", reused, false, nil},
		{"running-group-only-in-proc", []procEntry{{pid: 100, ppid: 1, pgrp: 100}}, true, []int{100}},
		{"nothing-left", []procEntry{{pid: 1, ppid: 0, pgrp: 1}}, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			for _, p := range treeMembers(tt.procs, 100, tt.running, self) {
				got = append(got, p.pid)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		stat       string
		state      byte
		ppid, pgrp int
		ok         bool
	}{
		{"123 (sleep) S 1 123 123 0 -1", 'S', 1, 123, true},
		{"7 (a) b) c) Z 5 6 7", 'Z', 5, 6, true},
		{"7 (x) S 1", 0, 0, 0, false},
		{"garbage", 0, 0, 0, false},
	}
	for _, tt := range tests {
		state, ppid, pgrp, ok := parseStat([]byte(tt.stat))
		if state != tt.state || ppid != tt.ppid || pgrp != tt.pgrp || ok != tt.ok {
			t.Errorf("parseStat(%q): got %c %d %d %v, want %c %d %d %v", tt.stat, state, ppid, pgrp, ok, tt.state, tt.ppid, tt.pgrp, tt.ok)
		}
	}
}

// TestMountFilter runs Seal's BPF program (as seccomp would: on struct seccomp_data) in x/net's
// BPF machine. That machine loads words big-endian, so the input is encoded that way.
func TestMountFilter(t *testing.T) {
	const (
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		arch   = 0xc000003e // AUDIT_ARCH_X86_64
	)
	type call struct {
		name string
		nr   uint32
		arch uint32
		want uint32
	}
	for _, amd64 := range []bool{true, false} {
		prog := mountFilter(arch, amd64)
		raw := make([]bpf.RawInstruction, len(prog))
		for i, in := range prog {
			raw[i] = bpf.RawInstruction{Op: in.Code, Jt: in.Jt, Jf: in.Jf, K: in.K}
		}
		insns, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatal("the filter does not disassemble")
		}
		vm, err := bpf.NewVM(insns)
		if err != nil {
			t.Fatalf("NewVM: %v", err)
		}
		calls := []call{
			{"read", 0, arch, allow},
			{"clone", 56, arch, allow},
			{"unshare", 272, arch, allow},
			{"other-arch", 165, 0x40000003, enosys},
		}
		for _, nr := range mountSyscalls {
			calls = append(calls, call{"mount-family", nr, arch, eperm})
		}
		if amd64 {
			calls = append(calls, call{"x32-mount", x32SyscallBit | 165, arch, enosys}, call{"x32-read", x32SyscallBit, arch, enosys})
		}
		for _, c := range calls {
			in := make([]byte, 64) // struct seccomp_data: nr, arch, ip, args[6]
			binary.BigEndian.PutUint32(in[0:], c.nr)
			binary.BigEndian.PutUint32(in[4:], c.arch)
			got, err := vm.Run(in)
			if err != nil {
				t.Fatalf("%s: Run: %v", c.name, err)
			}
			if uint32(got) != c.want {
				t.Errorf("amd64=%v %s (nr %d arch %#x): got %#x, want %#x", amd64, c.name, c.nr, c.arch, uint32(got), c.want)
			}
		}
	}
}
