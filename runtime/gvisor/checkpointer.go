package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// A pause's `runsc checkpoint` runs in a shell of its own (sh -c, the paths as its arguments)
// that creates the marker memory.new/complete once runsc succeeded. When this process dies
// while runsc saves the box, the shell goes on, so a complete image always carries the marker
// and a folder without it is an image cut short; settleImage names a marked folder memory/.
//
// The shell starts before the pause's quiesce, so that its start overlaps the round trip into
// the box, and it waits for one line on its stdin before it runs runsc: "go", once the box is
// quiesced and the image's folder made. A shell that reads anything else, or EOF (the pause gave
// up, or this process died before it said go), ends without running runsc. The marker is a
// builtin's empty file: no `mv` to start after runsc, which cost a pause 2–3 ms here.

// checkpointScript is the shell's script; $1 is the image's folder, the rest runsc's argv.
const checkpointScript = `new=$1; shift; IFS= read -r go && [ "$go" = go ] && "$@" </dev/null && : > "$new/` + imageDoneFile + `"`

// checkpointer is a started checkpoint shell that waits for its go.
type checkpointer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *limitedBuffer
	cancel context.CancelFunc
	// timeout bounds the shell from its go: runsc's save of the box's memory.
	timeout time.Duration
}

// startCheckpointer starts the shell of `runsc checkpoint --image-path=newDir` for box id,
// waiting for its go (run) or its end (abort). Exactly one of them must follow.
func (d *Driver) startCheckpointer(ctx context.Context, id string, flags []string, newDir string, timeout time.Duration) (*checkpointer, error) {
	cctx, cancel := context.WithCancel(ctx)
	args := append([]string{"-c", checkpointScript, "sh", newDir, d.opts.Runsc}, flags...)
	args = append(args, "checkpoint", "--image-path="+newDir, id)
	cmd := exec.CommandContext(cctx, "/bin/sh", args...)
	out := &limitedBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("gvisor: starting the checkpoint of %s: %w", id, err)
	}
	return &checkpointer{cmd: cmd, stdin: stdin, out: out, cancel: cancel, timeout: timeout}, nil
}

// run tells the shell to go and waits for it to end.
func (c *checkpointer) run() error {
	defer c.cancel()
	timer := time.AfterFunc(c.timeout, c.cancel)
	defer timer.Stop()
	_, werr := io.WriteString(c.stdin, "go\n")
	c.stdin.Close()
	err := c.cmd.Wait()
	if err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("runsc checkpoint: %w: %s", err, strings.TrimSpace(c.out.String()))
	}
	return nil
}

// abort ends a shell that was not told to go: it reads EOF and ends without running runsc.
func (c *checkpointer) abort() {
	c.stdin.Close()
	_ = c.cmd.Wait()
	c.cancel()
}

// settleImage names memory/ a complete image left in memory.new/ (its marker there: the shell
// of a pause whose end this process did not see, or the one it just waited for), and reports
// whether the box has a complete kept image.
func (d *Driver) settleImage(id string) (bool, error) {
	if d.hasImage(id) {
		return true, nil
	}
	newDir := d.boxes.boxPath(id, memoryNewDn)
	if _, err := os.Lstat(filepath.Join(newDir, imageDoneFile)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
	}
	// memory/ holds no complete image (no meta.json): whatever is there goes.
	keep := d.boxes.boxPath(id, memoryDn)
	if err := os.RemoveAll(keep); err != nil {
		return false, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
	}
	if err := os.Rename(newDir, keep); err != nil {
		return false, fmt.Errorf("gvisor: memory image of %s: %w", id, err)
	}
	return d.hasImage(id), nil
}
