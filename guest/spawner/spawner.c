// sandbox-spawn: the guest init's process starter, a small static program with no signal
// handlers.
//
// Why it exists. The guest init is a Go program, and Go installs a handler for almost every
// signal. A child forked from a Go process must reset each of them before it may run anything
// (the child shares the parent's memory until execve), which is some sixty system calls per
// command; inside gVisor every system call is a trap, and that loop was the largest part of
// starting a command. This program handles no signal at all, so its children go straight to
// execve.
//
// How it is used. PID 1 starts it once (where PID 1 has exec cgroups, from its spawner thread,
// so it carries the same seccomp filter and capability bounding set as every command), with
// one end of a
// SOCK_SEQPACKET socket pair as descriptor 3. Each request is one message (layout in
// guest/server/spawner.go) with the command's stdin, stdout and stderr, and optionally the
// exec cgroup's tasks file, as SCM_RIGHTS. The program clones a child with CLONE_VFORK and
// CLONE_PARENT: the child is PID 1's own child (PID 1 reaps it and sees its status, as for
// any command it started itself), and the program resumes only once the child called execve
// or died. It then answers one message: the child's pid, and the errno that stopped it if one did.
//
// What a command could do to it. It runs as root in the box, like the commands. It blocks
// every signal it can (a stray SIGTERM, SIGHUP or SIGTSTP from a command changes nothing),
// makes itself non-dumpable (no /proc/<pid>/fd or ptrace by a command, which lacks
// CAP_SYS_PTRACE) and keeps no descriptor but its socket. SIGKILL or SIGSTOP still end or stop
// it: PID 1 then sees its socket close, or no answer in time, and starts commands itself again.
// A request is checked to the byte before anything is used; a bad one gets EINVAL.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

enum {
	SOCK_FD = 3,
	MAGIC = 0x53425831, // "SBX1"
	FLAG_SETPGID = 1,   // the child leads a process group of its own
	FLAG_SETSID = 2,    // the child leads a session of its own, with stdin as its terminal
	FLAG_CGROUP = 4,    // a fourth descriptor: the tasks file of the cgroup the child enters
	MAX_REQUEST = 128 * 1024, // spawner.go's spawnMaxRequest
	MAX_STRINGS = 16384,
	STACK_SIZE = 64 * 1024,
};

// header is the start of a request; the strings follow it: the path, the working directory,
// argc arguments and envc environment entries, each ending in a NUL byte.
struct header {
	uint32_t magic;
	uint32_t flags;
	uint32_t argc;
	uint32_t envc;
};

// answer is the one message a request gets back.
struct answer {
	int32_t pid;   // the child, 0 when none was made
	int32_t error; // 0: the child runs the command; else the errno of the step that failed,
	               // and the child exited with 127 (its parent reaps it)
	int32_t step;  // the step that failed (STEP_*)
};

// The child's steps, in order, for the answer of one that failed.
enum {
	STEP_CLONE = 0,
	STEP_CGROUP = 1,
	STEP_SESSION = 2, // setsid or setpgid
	STEP_DIR = 3,
	STEP_FILES = 4,
	STEP_TERMINAL = 5,
	STEP_SIGNALS = 6,
	STEP_EXEC = 7,
};

// start is what the child needs; error is where it leaves its errno when a step fails (the
// child shares this memory until it calls execve or exits).
struct start {
	const char *path;
	const char *dir;
	char **argv;
	char **envp;
	uint32_t flags;
	int fds[4];
	volatile int error;
	volatile int step;
};

static char request[MAX_REQUEST];
static char *strings[MAX_STRINGS + 2];

// child runs in the new process, on its own stack, sharing the program's memory: only system
// calls, no allocation, then execve.
static int child(void *arg) {
	struct start *s = arg;
	s->step = STEP_CGROUP;
	if (s->flags & FLAG_CGROUP) {
		// "0": the writer itself (a write of the pid would cost a getpid more).
		if (write(s->fds[3], "0", 1) != 1) {
			goto fail;
		}
	}
	s->step = STEP_SESSION;
	if ((s->flags & FLAG_SETSID) && setsid() < 0) {
		goto fail;
	}
	if ((s->flags & FLAG_SETPGID) && setpgid(0, 0) < 0) {
		goto fail;
	}
	s->step = STEP_DIR;
	if (chdir(s->dir) < 0) {
		goto fail;
	}
	// The descriptors arrived at 4 and up (0–2 are /dev/null, 3 the socket), so no dup2
	// overwrites one that a later dup2 still reads.
	s->step = STEP_FILES;
	for (int i = 0; i < 3; i++) {
		if (dup2(s->fds[i], i) < 0) {
			goto fail;
		}
	}
	s->step = STEP_TERMINAL;
	if ((s->flags & FLAG_SETSID) && ioctl(0, TIOCSCTTY, 1) < 0) {
		goto fail;
	}
	s->step = STEP_SIGNALS;
	uint64_t none = 0;
	if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof none) < 0) {
		goto fail;
	}
	s->step = STEP_EXEC;
	execve(s->path, s->argv, s->envp);
fail:
	s->error = errno ? errno : EIO;
	_exit(127);
}

// parse checks a request of n bytes and fills s from it; it returns 0 or an errno.
static int parse(size_t n, struct start *s) {
	struct header h;
	if (n < sizeof h) {
		return EINVAL;
	}
	memcpy(&h, request, sizeof h);
	if (h.magic != MAGIC || h.argc == 0 || h.argc > MAX_STRINGS || h.envc > MAX_STRINGS ||
	    h.argc + h.envc > MAX_STRINGS) {
		return EINVAL;
	}
	if (h.flags & ~(uint32_t)(FLAG_SETPGID | FLAG_SETSID | FLAG_CGROUP)) {
		return EINVAL;
	}
	// Every string must end inside the message: count them while walking.
	uint32_t want = 2 + h.argc + h.envc;
	uint32_t got = 0;
	char *p = request + sizeof h;
	char *end = request + n;
	char *path = NULL, *dir = NULL;
	while (got < want) {
		char *nul = memchr(p, 0, (size_t)(end - p));
		if (nul == NULL) {
			return EINVAL;
		}
		if (got == 0) {
			path = p;
		} else if (got == 1) {
			dir = p;
		} else {
			strings[got - 2 + (got - 2 >= h.argc ? 1 : 0)] = p;
		}
		got++;
		p = nul + 1;
	}
	if (p != end || path[0] == 0 || dir[0] == 0) {
		return EINVAL;
	}
	strings[h.argc] = NULL;
	strings[h.argc + 1 + h.envc] = NULL;
	s->path = path;
	s->dir = dir;
	s->argv = strings;
	s->envp = strings + h.argc + 1;
	s->flags = h.flags;
	return 0;
}

int main(void) {
	// No signal but SIGKILL and SIGSTOP reaches this program's default action: a command's
	// stray signal neither ends nor stops it. The system call itself, not sigprocmask(3),
	// which leaves the C library's own signals 32 and 33 out (this program starts no thread).
	// Its children unblock them all before execve.
	uint64_t all = ~(uint64_t)0;
	if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, NULL, sizeof all) < 0) {
		return 1;
	}
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (fcntl(SOCK_FD, F_SETFD, FD_CLOEXEC) < 0) {
		return 1;
	}
	char *stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stack == MAP_FAILED) {
		return 1;
	}
	for (;;) {
		union {
			char buf[CMSG_SPACE(4 * sizeof(int))];
			struct cmsghdr align;
		} control;
		struct iovec iov = {request, sizeof request};
		struct msghdr msg = {0};
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = control.buf;
		msg.msg_controllen = sizeof control.buf;
		ssize_t n = recvmsg(SOCK_FD, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR) {
			continue; // a stop and continue may end the call so, though every signal is blocked
		}
		if (n <= 0) {
			return n == 0 ? 0 : 1; // PID 1 closed its end, or the socket broke
		}
		int fds[4] = {-1, -1, -1, -1};
		int nfds = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
				continue;
			}
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (nfds < 4) {
					fds[nfds++] = fd;
				} else {
					close(fd);
				}
			}
		}
		struct start s = {0};
		struct answer a = {0, 0, 0};
		int bad = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ? EINVAL : parse((size_t)n, &s);
		if (!bad && nfds != ((s.flags & FLAG_CGROUP) ? 4 : 3)) {
			bad = EINVAL;
		}
		for (int i = 0; i < nfds && !bad; i++) {
			if (fds[i] <= SOCK_FD) {
				bad = EINVAL;
			}
		}
		if (bad) {
			a.error = bad;
		} else {
			memcpy(s.fds, fds, sizeof fds);
			s.error = 0;
			// CLONE_PARENT: PID 1's child, not ours. CLONE_VM and CLONE_VFORK: no copy of our
			// memory, and we go on once it called execve or exited.
			long pid = clone(child, stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, &s);
			if (pid < 0) {
				a.error = errno;
			} else {
				a.pid = (int32_t)pid;
				a.error = s.error;
				a.step = s.error ? s.step : 0;
			}
		}
		// The answer first: PID 1 waits for it, not for our copies of the descriptors to close
		// (a command's stdout stays open a few system calls longer, never past this loop).
		ssize_t sent = send(SOCK_FD, &a, sizeof a, MSG_NOSIGNAL);
		for (int i = 0; i < nfds; i++) {
			close(fds[i]);
		}
		if (sent != (ssize_t)sizeof a) {
			return 1;
		}
	}
}
