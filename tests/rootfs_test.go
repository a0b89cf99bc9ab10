package tests

import (
	"strconv"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

// TestDefaultRootfsStartsCommandsLean: the default rootfs is made for commands that start often
// (scripts/ensure-rootfs.sh). Its C.UTF-8 locale, every command's LANG, comes from a
// locale-archive and works; a login shell (`bash -lc CMD`, how agents run commands) starts no
// process of its own before CMD; and what the login profiles set is unchanged: root's PATH for
// bash and for sh, whose /etc/profile still asks `id -u`.
func TestDefaultRootfsStartsCommandsLean(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID

	loc := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c", `test -s /usr/lib/locale/locale-archive && echo "$LANG" && ` +
		`python3 -c "import locale; print(locale.setlocale(locale.LC_ALL, ''))" && printf 'caf\303\251' | wc -m`}}), key)
	if want := "C.UTF-8\nC.UTF-8\n4\n"; loc.ExitCode != 0 || loc.Stdout != want {
		t.Errorf("the locale: exit %d, stdout %q, stderr %q; want exit 0 and %q (a locale-archive, LANG, python's setlocale, the characters of a UTF-8 word)",
			loc.ExitCode, loc.Stdout, loc.Stderr, want)
	}

	// PIDs inside the sandbox are handed out one after another: a login shell that started
	// processes of its own (Debian's profiles ran `id -u` and `mesg n`) leaves a gap before the
	// next shell's. A thread of PID 1 may take a number in between now and then, so the
	// closest of three tries counts.
	gap := -1
	for range 3 {
		out := s.Run(t, id, []string{"bash", "-c", `bash -lc 'echo $$'; bash -c 'echo $$'; true`}, key)
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("two shells' pids: got %q", out)
		}
		a, err1 := strconv.Atoi(f[0])
		b, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("two shells' pids: got %q", out)
		}
		if gap < 0 || b-a < gap {
			gap = b - a
		}
	}
	if gap != 1 {
		t.Errorf("the login shell's pid and the next shell's are %d apart in the closest of three tries, want 1: the login shell started processes of its own", gap)
	}

	const rootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, sh := range []string{"bash", "sh"} {
		body := e2e.MustJSON(t, map[string]any{"command": []string{sh, "-lc", `echo "$PATH"; id -u`}, "env": map[string]string{"PATH": "/bin"}})
		res := s.Exec(t, id, body, key)
		if want := rootPath + "\n0\n"; res.ExitCode != 0 || res.Stdout != want {
			t.Errorf("%s -lc: exit %d, stdout %q, stderr %q; want exit 0 and %q (the profile's PATH for root)", sh, res.ExitCode, res.Stdout, res.Stderr, want)
		}
	}
}
