package runtimetest

import (
	"strings"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// channelAttack is what a hostile command in box A tries against the channel between the
// control plane and A's guest init, hoping the next attach lands in box B (whose id is $B) or in
// a program of its own. Each step prints one "name:result" line; the suite checks that every
// one failed and that a new attach still reaches A's own init.
const channelAttack = `
# 1. Redirect the local runtime's host socket to B's (the issue-13 hijack).
( rm -f /run/sbx/host/init.sock && ln -s "../../$B/host/init.sock" /run/sbx/host/init.sock ) 2>/dev/null; echo "link-host-socket:$?"
# 2. Plant anything in the host socket's folder (a link, a file to fill the host's disk).
( echo x > /run/sbx/host/planted ) 2>/dev/null; echo "write-host-folder:$?"
# 3. Impersonate the init with its own binary, on the internal socket and on the host socket's
#    path. It fails to listen (exit 1) or keeps serving until the timeout (124: success).
#    (The host socket's folder exists only where the runtime dials a socket in it.)
for sock in @sbx-init /run/sbx/host/init.sock; do
  if [ "$sock" != @sbx-init ] && [ ! -d /run/sbx/host ]; then echo "impostor-init-$sock:none"; continue; fi
  SBX_SOCKET=$sock SBX_STATE_DIR=/tmp/impostor SBX_WORKSPACE=/tmp/impostor-ws SBX_REAP=0 timeout 3 /.sbx/init serve >/dev/null 2>&1
  [ $? = 124 ] && echo "impostor-init-$sock:0" || echo "impostor-init-$sock:1"
done
# 4. Read the init's key, environment or descriptors.
cat /proc/1/environ >/dev/null 2>&1; echo "read-init-environ:$?"
readlink /proc/1/fd/0 >/dev/null 2>&1; echo "readlink-init-fd:$?"
( echo fill >> /proc/1/fd/2 ) 2>/dev/null; echo "write-init-stderr:$?"
head -c 1 /proc/1/mem >/dev/null 2>&1; echo "read-init-mem:$?"
ls /proc/1/root/ >/dev/null 2>&1; echo "read-init-root:$?"
# 5. Find the key file the runtime handed over.
( ls /run/sbx/channel.key || ls /run/sbx/host/channel.key ) >/dev/null 2>&1; echo "find-key-file:$?"
# 6. Speak to the init directly, without the key: it must not serve.
python3 - <<'PY' 2>/dev/null; echo "speak-without-key:$?"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect("\0sbx-init")
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
try:
    got = s.recv(100)
except Exception:
    got = b""
sys.exit(0 if got else 1)
PY
# 7. Mount something over the hidden folder or gain privileges.
( mount -t tmpfs tmpfs /run/sbx ) 2>/dev/null; echo "mount:$?"
( umount /run/sbx/host ) 2>/dev/null; echo "umount-host-folder:$?"
# 8. The same from a user namespace of its own, where it holds CAP_SYS_ADMIN over its mounts:
#    uncover the host socket's folder.
unshare -Urm sh -c 'umount /run/sbx/host || umount -l /run/sbx/host; ls -A /run/sbx/host | grep -q .' >/dev/null 2>&1; echo "userns-uncover-host-folder:$?"
exit 0
`

// testChannel runs channelAttack in one box and checks that each step failed, that the box's
// runtime still attaches to the box's own init (a marker file in each workspace tells them
// apart), and that the other box is untouched.
func testChannel(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	a, b := CreateBox(t, d, spec), CreateBox(t, d, spec)
	ca, cb := Client(t, d, a), Client(t, d, b)
	MustRun(t, ca, proto.ExecRequest{Argv: []string{"sh", "-c", "echo " + a + " > whoami"}})
	MustRun(t, cb, proto.ExecRequest{Argv: []string{"sh", "-c", "echo " + b + " > whoami && echo b-secret > secret.txt"}})

	res := MustRun(t, ca, proto.ExecRequest{Argv: []string{"bash", "-c", channelAttack}, Env: []string{"B=" + b}})
	steps := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if name, rc, ok := strings.Cut(line, ":"); ok {
			steps[name] = rc
		}
	}
	for _, name := range []string{"link-host-socket", "write-host-folder", "impostor-init-@sbx-init", "impostor-init-/run/sbx/host/init.sock", "read-init-environ",
		"readlink-init-fd", "write-init-stderr", "read-init-mem", "read-init-root", "find-key-file", "speak-without-key", "mount", "umount-host-folder", "userns-uncover-host-folder"} {
		rc, ok := steps[name]
		switch {
		case !ok:
			t.Errorf("attack step %s did not report (stdout %q, stderr %q)", name, res.Stdout, res.Stderr)
		case rc == "0":
			t.Errorf("attack step %s succeeded inside box %s, want it to fail", name, a)
		}
	}

	// A new attach (no cached one) reaches A's own init, and B is untouched.
	fresh := Client(t, d, a)
	res = MustRun(t, fresh, proto.ExecRequest{Argv: []string{"cat", "whoami"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != a {
		t.Errorf("a new attach to %s reads whoami %q, want %q", a, got, a)
	}
	res = MustRun(t, fresh, proto.ExecRequest{Argv: []string{"sh", "-c", "cat secret.txt 2>&1; true"}})
	if strings.Contains(string(res.Stdout), "b-secret") {
		t.Errorf("box %s reads box %s's file: %q", a, b, res.Stdout)
	}
	if box := mustGet(t, d, a); box.Phase != runtime.PhaseRunning {
		t.Errorf("box %s is %s (%s) after the failed attacks, want running", a, box.Phase, box.Reason)
	}
	res = MustRun(t, Client(t, d, b), proto.ExecRequest{Argv: []string{"cat", "whoami", "secret.txt"}})
	if got := string(res.Stdout); got != b+"\nb-secret\n" {
		t.Errorf("box %s reads %q, want its own marker and secret", b, got)
	}
}
