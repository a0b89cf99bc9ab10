package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"syscall"
	"testing"
)

// TestSpawnRequest: the flags each way of starting gives, the layout spawner.c reads, and
// every start the program cannot express left to Go's fork (errNoSpawner).
func TestSpawnRequest(t *testing.T) {
	req, err := spawnRequest(nil, "/bin/sh", "/w", []string{"sh", "-c", "x"}, []string{"A=1"}, &syscall.SysProcAttr{Setpgid: true}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := binary.LittleEndian.AppendUint32(nil, spawnMagic)
	want = binary.LittleEndian.AppendUint32(want, spawnSetpgid|spawnCgroup)
	want = binary.LittleEndian.AppendUint32(want, 3)
	want = binary.LittleEndian.AppendUint32(want, 1)
	want = append(want, "/bin/sh\x00/w\x00sh\x00-c\x00x\x00A=1\x00"...)
	if !bytes.Equal(req, want) {
		t.Fatalf("request: got %q, want %q", req, want)
	}
	tty, err := spawnRequest(req, "/bin/sh", "/w", []string{"sh"}, nil, &syscall.SysProcAttr{Setsid: true, Setctty: true}, false)
	if err != nil || binary.LittleEndian.Uint32(tty[4:]) != spawnSetsid {
		t.Fatalf("a terminal's start: flags %x, %v", binary.LittleEndian.Uint32(tty[4:]), err)
	}

	big := strings.Repeat("x", spawnMaxRequest)
	for name, tt := range map[string]struct {
		argv, env []string
		sys       *syscall.SysProcAttr
	}{
		"NUL in an argument":    {[]string{"a\x00b"}, nil, nil},
		"NUL in the env":        {[]string{"a"}, []string{"A=\x00"}, nil},
		"larger than it reads":  {[]string{"a"}, []string{"A=" + big}, nil},
		"too many strings":      {make([]string, spawnMaxStrings+1), nil, nil},
		"no arguments":          {nil, nil, nil},
		"credentials":           {[]string{"a"}, nil, &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: 1}}},
		"a terminal elsewhere":  {[]string{"a"}, nil, &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 1}},
		"setsid alone":          {[]string{"a"}, nil, &syscall.SysProcAttr{Setsid: true}},
		"both":                  {[]string{"a"}, nil, &syscall.SysProcAttr{Setsid: true, Setctty: true, Setpgid: true}},
		"a parent death signal": {[]string{"a"}, nil, &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}},
	} {
		if _, err := spawnRequest(nil, "/bin/a", "/", tt.argv, tt.env, tt.sys, false); !errors.Is(err, errNoSpawner) {
			t.Errorf("%s: got %v, want errNoSpawner", name, err)
		}
	}
}
