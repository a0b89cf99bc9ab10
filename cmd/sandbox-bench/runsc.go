package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sandboxd/guest/proto"
)

// What the benchmark reads of the gvisor driver's state folder (runtime/gvisor):
//
//	<state>/boxes/<id>/runsc-flags.json     the global runsc flags of the box's container
//	<state>/boxes/<id>/bundle/config.json   its OCI config
//	<state>/boxes/<id>/workspace/           its workspace, mounted at /workspace
//
// Container ids are the sandbox ids.

func (b *bench) boxPath(id, name string) string {
	return filepath.Join(b.stateDir, "boxes", id, name)
}

// containerFlags are the global runsc flags the driver made sandbox id's container with: a
// bare runsc call on the same container needs them identical.
func (b *bench) containerFlags(id string) ([]string, error) {
	data, err := os.ReadFile(b.boxPath(id, "runsc-flags.json"))
	if err != nil {
		return nil, fmt.Errorf("the driver's runsc flags of %s: %w", id, err)
	}
	var flags []string
	if err := json.Unmarshal(data, &flags); err != nil || len(flags) == 0 {
		return nil, fmt.Errorf("the driver's runsc flags of %s: %q (%v)", id, data, err)
	}
	if b.flagsShown == "" {
		shown := make([]string, 0, len(flags))
		for _, f := range flags {
			if strings.HasPrefix(f, "--root=") {
				f = "--root=<state>/runsc-root"
			}
			shown = append(shown, f)
		}
		b.flagsShown = "runsc " + strings.Join(shown, " ")
	}
	return flags, nil
}

// runscRun runs one short runsc command whose output nobody reads (never create or start:
// see runscLogged).
func (b *bench) runscRun(ctx context.Context, flags []string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.runsc, append(append([]string{}, flags...), args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// runscExec is a bare `runsc <flags> exec <id> <argv…>`; it returns the command's stdout.
func (b *bench) runscExec(ctx context.Context, flags []string, id string, argv ...string) (string, error) {
	args := append(append(append([]string{}, flags...), "exec", id), argv...)
	cmd := exec.CommandContext(ctx, b.runsc, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("runsc exec %s %v: %v: %s", id, argv, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// runscLogged runs runsc create or start with its stdio on a log file opened O_APPEND: the
// sandbox inherits them and keeps them open, so they must never be a pipe read to EOF.
func (b *bench) runscLogged(ctx context.Context, logPath string, flags []string, args ...string) error {
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.runsc, append(append([]string{}, flags...), args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 600 {
			tail = tail[len(tail)-600:]
		}
		return fmt.Errorf("runsc %s: %v (log: %s)", args[0], err, strings.Join(strings.Fields(string(tail)), " "))
	}
	return nil
}

// rawBundle is a bundle run with bare runsc in its own --root folder: the OCI config the
// driver wrote for a reference sandbox (same rootfs, mounts, limits, capabilities and PID 1,
// the guest init), with its own empty workspace and without cgroupsPath (runsc then uses
// "/<id>", as the driver does), and the driver's global flags with only --root changed.
type rawBundle struct {
	b       *bench
	root    string
	bundle  string
	logPath string
	flags   []string
	// keyFile, when the guest init of the config takes a channel key, is where each new
	// container's key is put (in its host folder; the init deletes it once read).
	keyFile string
	// imageSizes are the sizes of the images the pause suite's bare checkpoints wrote.
	imageSizes []int64
}

// newRawBundle prepares a raw bundle from sandbox refID's bundle and flags.
func (b *bench) newRawBundle(refID string) (*rawBundle, error) {
	flags, err := b.containerFlags(refID)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(b.boxPath(refID, filepath.Join("bundle", "config.json")))
	if err != nil {
		return nil, fmt.Errorf("the driver's OCI config of %s: %w", refID, err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("the driver's OCI config of %s: %w", refID, err)
	}
	dir, err := os.MkdirTemp(b.tmp, "raw-")
	if err != nil {
		return nil, err
	}
	r := &rawBundle{b: b, root: filepath.Join(dir, "root"), bundle: filepath.Join(dir, "bundle"), logPath: filepath.Join(dir, "runsc.log")}
	ws := filepath.Join(dir, "workspace")
	host := filepath.Join(dir, "host") // the box's own host-socket folder (never the reference's)
	for _, d := range []string{r.root, r.bundle, ws, host} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(ws, 0o755); err != nil {
		return nil, err
	}
	mounts, _ := spec["mounts"].([]any)
	found := false
	for _, m := range mounts {
		mm, ok := m.(map[string]any)
		if !ok {
			continue
		}
		switch mm["destination"] {
		case "/workspace":
			mm["source"] = ws
			found = true
		case "/run/sbx/host":
			mm["source"] = host
		}
	}
	if !found {
		return nil, fmt.Errorf("the driver's OCI config of %s has no /workspace mount", refID)
	}
	if linux, ok := spec["linux"].(map[string]any); ok {
		delete(linux, "cgroupsPath")
	}
	if proc, ok := spec["process"].(map[string]any); ok {
		env, _ := proc["env"].([]any)
		for _, e := range env {
			if v, ok := e.(string); ok && strings.HasPrefix(v, proto.ChannelKeyFileEnv+"=/run/sbx/host/") {
				r.keyFile = filepath.Join(host, filepath.Base(strings.TrimPrefix(v, proto.ChannelKeyFileEnv+"=")))
			}
		}
	}
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(r.bundle, "config.json"), out, 0o600); err != nil {
		return nil, err
	}
	found = false
	for i, f := range flags {
		if strings.HasPrefix(f, "--root=") {
			flags[i] = "--root=" + r.root
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("the driver's runsc flags %q have no --root=", flags)
	}
	r.flags = flags
	return r, nil
}

// createStartExec times runsc create + start + exec true of a new container, then deletes it
// (untimed).
func (r *rawBundle) createStartExec(ctx context.Context) (time.Duration, error) {
	id := "rawbench-" + randomHex(8) // fixed length: runsc matches ids by prefix
	r.b.mu.Lock()
	if r.b.raw[r] == nil {
		r.b.raw[r] = map[string]bool{}
	}
	r.b.raw[r][id] = true
	r.b.mu.Unlock()
	if r.keyFile != "" {
		// The guest init takes its channel key at start (what the driver hands it, untimed).
		if err := os.WriteFile(r.keyFile, []byte(proto.EncodeChannelKey(proto.NewChannelKey())), 0o400); err != nil {
			return 0, err
		}
	}
	d, err := timed(func() error {
		if err := r.b.runscLogged(ctx, r.logPath, r.flags, "create", "--bundle="+r.bundle, id); err != nil {
			return err
		}
		if err := r.b.runscLogged(ctx, r.logPath, r.flags, "start", id); err != nil {
			return err
		}
		_, err := r.b.runscExec(ctx, r.flags, id, "true")
		return err
	})
	if derr := r.b.deleteRaw(r, id); derr != nil && err == nil {
		err = derr
	}
	return d, err
}

// deleteRaw deletes a bare container and the cgroups runsc may leave.
func (b *bench) deleteRaw(r *rawBundle, id string) error {
	err := b.runscRun(context.Background(), r.flags, "delete", "-force", id)
	if err != nil {
		if _, serr := os.Stat(filepath.Join(r.root, id+"_sandbox:"+id+".state")); os.IsNotExist(serr) {
			err = nil // it was never created
		}
	}
	removeCgroups(id)
	if err == nil {
		b.mu.Lock()
		delete(b.raw[r], id)
		b.mu.Unlock()
	}
	return err
}
