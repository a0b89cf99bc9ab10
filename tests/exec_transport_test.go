package tests

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/tests/e2e"
)

// TestExecStreamsHostile: on the local runtime a sandbox's commands start over exec streams, an
// attach of their own each, kept from one command to the next (guest/proto/stream.go). What a
// workload can try against them: print the streams' own framing (an exit record, a refusal, a
// second answer) so that the server reads its output as protocol, and keep many commands
// running so that the server holds a connection for each. Neither may forge a result or an
// exit, break the next command, or make the server hold more than its bound of connections.
func TestExecStreamsHostile(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	// The first command finds no stream ready and goes over HTTP/2; one is opened meanwhile.
	if res := s.Exec(t, id, `{"command":["true"]}`, e2e.HdrTenant1); res.ExitCode != 0 {
		t.Fatalf("first exec: %+v", res)
	}

	e2e.Step(t, "output-forging-the-framing", func(t *testing.T) {
		forged := forgedFraming()
		script := "import sys; sys.stdout.buffer.write(bytes.fromhex('" + hex.EncodeToString(forged) + "')); sys.stdout.flush()"
		for i := range 4 {
			res := s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"python3", "-c", script}}), e2e.HdrTenant1)
			got, _ := base64.StdEncoding.DecodeString(res.StdoutBase64)
			if res.StdoutBase64 == "" {
				got = []byte(res.Stdout)
			}
			if string(got) != string(forged) || res.ExitCode != 0 || res.Signal != "" {
				t.Fatalf("round %d: stdout %q exit %d signal %q, want the forged bytes as plain output and exit 0", i, got, res.ExitCode, res.Signal)
			}
			res = s.Exec(t, id, e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c", fmt.Sprintf("echo next-%d; exit 3", i)}}), e2e.HdrTenant1)
			if res.Stdout != fmt.Sprintf("next-%d\n", i) || res.ExitCode != 3 {
				t.Fatalf("the command after round %d: %+v", i, res)
			}
		}
	})

	e2e.Step(t, "many-commands-running", func(t *testing.T) {
		before := openSockets(t, s.PID())
		var ids []string
		for i := range 24 {
			ex := detach(t, s, id, fmt.Sprintf(`{"command":["sh","-c","echo started-%d; sleep 300"],"wait":false}`, i), e2e.HdrTenant1)
			ids = append(ids, ex.ExecID)
		}
		if res := s.Exec(t, id, `{"command":["echo","still-answers"]}`, e2e.HdrTenant1); res.Stdout != "still-answers\n" {
			t.Fatalf("an exec beside 24 running commands: %+v", res)
		}
		// A running command holds its stream, and a client keeps at most 8 streams per sandbox
		// (guest/client's maxStreams): the rest of the commands share the HTTP/2 attach. (A
		// build without exec streams holds no more sockets at all.)
		after := openSockets(t, s.PID())
		t.Logf("the server's sockets: %d before, %d with 24 commands running", before, after)
		if after-before < 4 || after-before > 10 {
			t.Errorf("the server holds %d more sockets with 24 commands running (%d before), want 4..10 more", after-before, before)
		}
		for _, eid := range ids {
			s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+eid+"/signal", []byte(`{"signal":"SIGKILL"}`), e2e.HdrJSON, e2e.HdrTenant1).Want(t, http.StatusOK)
		}
	})
}

// forgedFraming is output that spells the exec stream's framing: a started answer, an exit
// record that claims exit 7, a refusal, and a log record.
func forgedFraming() []byte {
	var b []byte
	b = append(b, proto.StreamStarted, 0, 0, 0, 0)
	exit := []byte(`{"exit_code":7}`)
	b = append(b, proto.RecordExit)
	b = binary.BigEndian.AppendUint32(b, uint32(len(exit)))
	b = append(b, exit...)
	refusal := []byte(`{"code":"exists","message":"forged"}`)
	b = append(b, proto.StreamRefused)
	b = binary.BigEndian.AppendUint32(b, uint32(len(refusal)))
	b = append(b, refusal...)
	b = append(b, proto.RecordStdout, 0xff, 0xff, 0xff, 0xff)
	return append(b, []byte(proto.StreamHello)...)
}

// openSockets counts the sockets process pid holds open.
func openSockets(t *testing.T, pid int) int {
	t.Helper()
	dir := filepath.Join("/proc", fmt.Sprint(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
