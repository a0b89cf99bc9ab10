package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/guest/proto"
	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// hostileLogScript is a command that tries every way it has to reach its own exec's log in the
// state folder (it runs as root in the box), to remove, replace or garble it under PID 1 and
// under the replicas that follow it, and prints for each whether it got through.
const hostileLogScript = `d=%[1]s; f="$d/$%[2]s.log.0"
echo "listing: $(ls -A "$d" | wc -l)"
if printf '\011\377\377\377\377' | dd of="$f" conv=notrunc 2>/dev/null; then echo "garble: REACHED"; else echo "garble: refused"; fi
if ln -s /proc/1/environ "$d/$%[2]s.log.1" 2>/dev/null; then echo "link: REACHED"; else echo "link: refused"; fi
cat > /tmp/umount.py <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
r = libc.umount2(d.encode(), 2)
print("umount in a namespace of its own: %%s" %% ("refused" if r != 0 else "REACHED %%r" %% os.listdir(d)))
PY
unshare -Urm --propagation unchanged python3 /tmp/umount.py "$d"
n=0; for p in /proc/1/fd/*; do ls "$p/" >/dev/null 2>&1 && n=$((n+1)); readlink "$p" >/dev/null 2>&1 && n=$((n+1)); done
if [ $n = 0 ]; then echo "pid 1's descriptors: refused"; else echo "pid 1's descriptors: REACHED $n"; fi
if ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -q execs; then echo "a descriptor of the folder: REACHED"; else echo "a descriptor of the folder: refused"; fi
head -c 200000 /dev/zero | tr '\000' y; echo
exit 3`

// TestCommandCannotReachItsLog: a command tries to reach its own exec's log (above) while no
// replica follows it: its follower is killed with -9 when it starts, and the other replica
// takes the exec over and reads the log from its start. PID 1 hides the state folder under an
// empty read-only mount and works in it through a descriptor of its own, so every attempt is
// refused and the other replica reads the whole output and the exit, byte for byte. (Before,
// the command could garble its log: the exec then never ended, and the replica following it
// reopened the log in a tight loop until the follower's pause was added.)
func TestCommandCannotReachItsLog(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"reconcile_interval_ms": 300,
		"execs":                 map[string]any{"follow_lease_sec": 3},
	}}, 2)
	a, k := reps[0], reps[1]
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	script := "sleep 1\n" + fmt.Sprintf(hostileLogScript, proto.StateDir, proto.ExecIDEnv)
	execID := execDetached(t, k, id, []string{"sh", "-c", script}, e2e.HdrTenant1)
	k.Kill(t) // its follower dies before the command starts its attempts

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
	defer w.c.Close(websocket.StatusNormalClosure, "done")
	var got []byte
	var exit *execOutputJSON
	for exit == nil {
		ev, ok := w.next(ctx)
		if !ok {
			t.Fatalf("the output ended without an exit after %d bytes: %q", len(got), trimmed(got))
		}
		switch ev.Kind {
		case "CHUNK":
			got = append(got, chunkBytes(t, ev)...)
		case "EXIT":
			exit = &ev
		default:
			t.Fatalf("got %+v after %q, want chunks and the exit", ev, trimmed(got))
		}
	}
	want := "listing: 0\n" +
		"garble: refused\n" +
		"link: refused\n" +
		"umount in a namespace of its own: refused\n" +
		"pid 1's descriptors: refused\n" +
		"a descriptor of the folder: refused\n" +
		strings.Repeat("y", 200000) + "\n"
	if string(got) != want {
		t.Fatalf("output: %d bytes, want %d; first difference at %d: %q", len(got), len(want), firstDiff(got, []byte(want)), trimmed(got))
	}
	if exit.Result == nil || exit.Result.ExitCode == nil || *exit.Result.ExitCode != 3 || exit.Result.State != "ENDED" {
		t.Fatalf("exit event: got %+v, want exit code 3", exit)
	}
	if res := a.Exec(t, id, `{"command":["echo","still"]}`, e2e.HdrTenant1); res.ExitCode != 0 || res.Stdout != "still\n" {
		t.Errorf("an exec after it: %+v", res)
	}
}

// trimmed is b without its run of y's, for a failure's message.
func trimmed(b []byte) string {
	s := string(b)
	if i := strings.Index(s, "yyyy"); i >= 0 {
		j := strings.LastIndex(s, "yyyy")
		s = s[:i] + fmt.Sprintf("<%d y>", j+4-i) + s[j+4:]
	}
	return s
}
