package gvisor

import (
	"context"
)

// The containers of paused boxes are deleted in the background (Driver.teardowns, a
// runtime.Jobs keyed by box id).
//
// A `runsc checkpoint` that succeeds ends the box's sandbox and gofer processes once the image
// is written: the box holds no compute from then on. What is left of its container is runsc's
// bookkeeping (`runsc delete`: its state file and lock, the leftover cgroups, the shared
// null-netns mount) and the egress network, about 10–15 ms here, which a pause need not wait
// for. Pause starts it (startTeardown) and returns; destroyContainer, which every later
// operation that creates or deletes the box's container goes through, waits for it first. A
// teardown that fails is only logged: the next destroyContainer runs the same steps again, as
// it does after a crash. At most one runs per box: the caller holds the box's lock, and a pause
// only checkpoints a running box, which no teardown is deleting.

// startTeardown deletes a checkpointed box's container in the background (teardowns).
func (d *Driver) startTeardown(id string) {
	d.teardowns.Start(id, func() {
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		if err := d.destroyContainerNow(ctx, id); err != nil {
			d.log.Warn("deleting a paused box's container; the next start, resume or delete does it again", "box", id, "err", err)
		}
	})
}
