package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// straySignals are the signals a process in the box can send PID 1 (gVisor does not shield a
// PID 1 from its namespace as Linux shields a container's init) that would end or stop the
// init, and with it every command running there:
//   - SIGHUP, which Go's runtime dies of unless asked for: `kill -HUP 1`, a container's idiom
//     for "reload", left the sandbox FAILED;
//   - the ones Go treats as a crash when a process sends them: a goroutine dump and exit on
//     SIGQUIT; SIGABRT, SIGSYS, SIGTRAP, SIGILL, SIGSTKFLT; SIGSEGV, SIGBUS and SIGFPE, which a
//     process can send as well as a fault can raise;
//   - SIGTSTP, SIGTTIN and SIGTTOU, which Go leaves at their default action: they stopped PID
//     1, and the box then answered nothing until a SIGCONT or its stop.
//
// A signal the init asks for (os/signal) is handed to it only when a process sent it: a real
// fault (SIGSEGV from a bad address) still crashes PID 1. The children of PID 1 get every one
// of these at its default action, as before: the fork resets every signal Go handles (which
// costs the three stop signals one system call each in every command's fork).
//
// SIGTERM and SIGINT ask the init to stop (what a Kubernetes pod's deletion sends); where the
// runtime never sends them (proto.StopSignalsEnv: the local runtime ends a box with SIGKILL),
// PID 1 ignores them too. Still ending the init from inside the box: SIGKILL; SIGTERM and
// SIGINT on Kubernetes; and signals 32 and 34, which Go leaves at their default action (C
// libraries reserve them) and os/signal cannot take: ignoring them would have every command
// inherit them ignored. Each leaves the sandbox FAILED with its reason, and a start brings it
// back on its workspace.
var straySignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT, syscall.SIGBUS,
	syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSTKFLT, syscall.SIGSYS,
	syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
}

// strayLogEvery bounds the init's log lines about stray signals: a process that sends
// signals in a loop must not fill the runtime's log of the box.
const strayLogEvery = time.Minute

// ignoreSignals keeps PID 1 running through sigs (straySignals, perhaps with the stop
// signals) until the process ends, and logs how many came at most once per strayLogEvery.
func ignoreSignals(log *slog.Logger, sigs []os.Signal) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, sigs...)
	go func() {
		var n int
		var last time.Time
		for sig := range ch {
			n++
			if now := time.Now(); now.Sub(last) >= strayLogEvery {
				log.Warn("ignored signals a process in the box sent to PID 1", "count", n, "last", sig.String())
				n, last = 0, now
			}
		}
	}()
}
