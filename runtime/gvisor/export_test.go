package gvisor

import (
	"context"
	"time"
)

// ContainerFlags exposes the global runsc flags of a box's container to the tests.
func (d *Driver) ContainerFlags(id string) ([]string, error) { return d.containerFlags(id) }

// SandboxPid returns the host pid of a box's sandbox process (0 when there is none).
func (d *Driver) SandboxPid(ctx context.Context, id string) (int, error) {
	st, _, err := d.readState(ctx, id)
	return st.sandboxPid(), err
}

// ContainerKept reports whether runsc still keeps the box's container (its state file).
func (d *Driver) ContainerKept(ctx context.Context, id string) (bool, error) {
	_, exists, err := d.readState(ctx, id)
	return exists, err
}

// SetTeardownHold sets how long a pause's container deletion waits for the box's next record
// write at most (teardown.go).
func (d *Driver) SetTeardownHold(hold time.Duration) { d.teardownHold = hold }

// BoxLog returns the end of a box's runsc log (its init's log among runsc's lines).
func (d *Driver) BoxLog(id string) string { return string(d.readLogTail(id, 4<<20)) }
