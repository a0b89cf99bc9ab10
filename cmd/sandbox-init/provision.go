package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"sandboxd/guest/proto"
)

// The channel key of a Kubernetes pod whose image carries the init (proto.ChannelKeyAwaitEnv):
// PID 1 waits for its key file, and the runtime's first attach, `connect provision KEYFILE`,
// brings the key as the first line of its stdin. Until PID 1 has the key it does not listen,
// so no exec has run and nothing of the workload exists to see the key on its way.

// awaitFile waits until path exists (false: a stop signal came first).
func awaitFile(path string, stop <-chan os.Signal) bool {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Lstat(path); err == nil {
			return true
		}
		select {
		case <-stop:
			return false
		case <-tick.C:
		}
	}
}

// provision reads the key line from stdin and, unless PID 1 listens already (it has its key,
// and then the key is not written anywhere), writes the key to keyFile through a temporary
// file in its folder, so that PID 1 never reads half a key. It returns the connection when
// PID 1 answered the first dial, else nil (the caller dials until PID 1 listens).
func provision(stdin io.Reader, keyFile string, dial func() (*net.UnixConn, error)) (*net.UnixConn, error) {
	line := make([]byte, 2*proto.ChannelKeyLen+1)
	defer clear(line)
	if _, err := io.ReadFull(stdin, line); err != nil {
		return nil, fmt.Errorf("reading the channel key from stdin: %w", err)
	}
	if line[len(line)-1] != '\n' {
		return nil, errors.New("the channel key line is not hex-encoded key bytes and a newline")
	}
	if _, err := proto.ParseChannelKey(string(line[:len(line)-1])); err != nil {
		return nil, err
	}
	if c, err := dial(); err == nil {
		return c, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(keyFile), ".channel.key-*")
	if err != nil {
		return nil, fmt.Errorf("writing the channel key: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o400)
	if err == nil {
		_, err = tmp.Write(line[:len(line)-1])
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), keyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("writing the channel key: %w", err)
	}
	return nil, nil
}
