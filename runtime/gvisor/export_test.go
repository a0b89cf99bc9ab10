package gvisor

import "context"

// ContainerFlags exposes the global runsc flags of a box's container to the tests.
func (d *Driver) ContainerFlags(id string) ([]string, error) { return d.containerFlags(id) }

// SandboxPid returns the host pid of a box's sandbox process (0 when there is none).
func (d *Driver) SandboxPid(ctx context.Context, id string) (int, error) {
	st, _, err := d.readState(ctx, id)
	return st.sandboxPid(), err
}
