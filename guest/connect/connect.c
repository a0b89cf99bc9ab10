// sandbox-connect: the Kubernetes runtime's attach to the guest init, a small static program.
//
// Why it exists. The runtime reaches PID 1 of a pod through a pods/exec of a program that dials
// PID 1's socket and relays the exec's stdin and stdout to it. `sandbox-init connect` does the
// same, but it is a Go program: inside gVisor a Go program's start (its runtime's threads,
// memory and signal set-up, each a trap) takes some 50 ms against some 16 for a C program, and
// every create waits for one attach. The runtime runs this program and falls back to
// `sandbox-init connect` where an image does not carry it (runtime/kube/attach.go); the two
// behave the same, and cmd/sandbox-init's tests run both against a real init.
//
// What it does, in order (the same as cmd/sandbox-init's connect):
//   1. Makes itself non-dumpable (nothing in the box may trace it or read its memory, which
//      may hold the channel key) and drops every capability.
//   2. With `provision KEYFILE` (the first attach of a pod whose PID 1 waits for its key):
//      reads the key line from stdin (64 hex digits and a newline, nothing more), and unless
//      PID 1 already listens, writes the key to KEYFILE through a temporary file of mode 0400
//      in its folder and a rename, so PID 1 never reads half a key.
//   3. Dials PID 1's socket (SBX_SOCKET, default "@sbx-init", "@" meaning the abstract
//      namespace) every 5 ms for up to 10 s; with provision, removes whatever is left of KEYFILE.
//   4. Writes the ready byte (0x06) to stdout, then relays both ways until PID 1 closes the
//      connection or stdout breaks; at stdin's end it half-closes the connection.
// Errors go to stderr beginning "sandbox-connect: " (the runtime tells by that that this
// program ran), with exit status 1; a wrong command line exits 2.
//
// The constants are guest/proto's: ChannelKeyLen, ConnectReady, SocketPath, ConnectProvision,
// ConnectProgramError.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum {
	KEY_HEX = 64,         // proto.ChannelKeyLen bytes, hex-encoded
	READY = 0x06,         // proto.ConnectReady
	WAIT_MS = 10 * 1000,  // cmd/sandbox-init's connectWait
	RETRY_MS = 5,         // between two dials
	BUF_SIZE = 256 * 1024 // one read, then one write of what it got
};

static const char default_socket[] = "@sbx-init"; // proto.SocketPath
static const char provision_arg[] = "provision";  // proto.ConnectProvision

static int fail(const char *what, int err) {
	if (err != 0) {
		dprintf(2, "sandbox-connect: %s: %s\n", what, strerror(err));
	} else {
		dprintf(2, "sandbox-connect: %s\n", what);
	}
	return 1;
}

// write_all writes n bytes of p to fd (send without SIGPIPE on a socket); 0 or an errno.
static int write_all(int fd, const char *p, size_t n, int is_socket) {
	while (n > 0) {
		ssize_t w = is_socket ? send(fd, p, n, MSG_NOSIGNAL) : write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR) {
				continue;
			}
			return errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

// read_full reads exactly n bytes from fd; 0, an errno, or -1 at an early end.
static int read_full(int fd, char *p, size_t n) {
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0) {
			if (errno == EINTR) {
				continue;
			}
			return errno;
		}
		if (r == 0) {
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

// clear_caps empties the effective, permitted and inheritable sets (this program has one
// thread yet, so that is the whole process) and checks that nothing is left.
static int clear_caps(void) {
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	memset(d, 0, sizeof d);
	if (syscall(SYS_capset, &h, d) < 0) {
		return errno;
	}
	h.version = _LINUX_CAPABILITY_VERSION_3;
	h.pid = 0;
	if (syscall(SYS_capget, &h, d) < 0) {
		return errno;
	}
	if (d[0].effective | d[1].effective | d[0].permitted | d[1].permitted) {
		return EPERM;
	}
	return 0;
}

// address fills sa for a unix socket name as Go's net package does: "@name" is abstract (no
// trailing NUL counted), anything else a path.
static int address(const char *name, struct sockaddr_un *sa, socklen_t *len) {
	size_t n = strlen(name);
	if (n == 0 || n >= sizeof sa->sun_path) {
		return EINVAL;
	}
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, name, n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	if (name[0] == '@') {
		sa->sun_path[0] = 0;
		*len -= 1;
	}
	return 0;
}

// dial is one connect to PID 1's socket: the descriptor, or -1 with errno set.
static int dial(const struct sockaddr_un *sa, socklen_t len) {
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		return -1;
	}
	if (connect(fd, (const struct sockaddr *)sa, len) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int is_hex(char c) {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// write_key writes the key to key_file through a temporary file of mode 0400 in its folder
// and a rename; 0 or an errno. No temporary file is left either way.
static int write_key(const char *key_file, const char *key) {
	char tmp[PATH_MAX];
	const char *slash = strrchr(key_file, '/');
	int n = slash == NULL ? snprintf(tmp, sizeof tmp, ".channel.key-XXXXXX")
	                      : snprintf(tmp, sizeof tmp, "%.*s/.channel.key-XXXXXX", (int)(slash - key_file), key_file);
	if (n < 0 || (size_t)n >= sizeof tmp) {
		return ENAMETOOLONG;
	}
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		return errno;
	}
	int err = fchmod(fd, 0400) < 0 ? errno : 0;
	if (err == 0) {
		err = write_all(fd, key, KEY_HEX, 0);
	}
	if (close(fd) < 0 && err == 0) {
		err = errno;
	}
	if (err == 0 && rename(tmp, key_file) < 0) {
		err = errno;
	}
	if (err != 0) {
		unlink(tmp);
	}
	return err;
}

// provision reads and checks the key line, then writes the key to key_file unless PID 1
// listens already (it has its key): the connection then, else -1 (the caller dials). On an
// error it has printed it and returns -2.
static int provision(const char *key_file, const struct sockaddr_un *sa, socklen_t len) {
	char line[KEY_HEX + 1];
	int err = read_full(0, line, sizeof line);
	if (err != 0) {
		explicit_bzero(line, sizeof line);
		if (err < 0) {
			fail("reading the channel key from stdin: it ended first", 0);
		} else {
			fail("reading the channel key from stdin", err);
		}
		return -2;
	}
	int ok = line[KEY_HEX] == '\n';
	for (int i = 0; i < KEY_HEX && ok; i++) {
		ok = is_hex(line[i]);
	}
	if (!ok) {
		explicit_bzero(line, sizeof line);
		fail("the channel key line is not 64 hex digits and a newline", 0);
		return -2;
	}
	int fd = dial(sa, len);
	if (fd < 0) {
		err = write_key(key_file, line);
	}
	explicit_bzero(line, sizeof line);
	if (err != 0) {
		fail("writing the channel key", err);
		return -2;
	}
	return fd;
}

static long long now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

// stdin_to_socket relays stdin to the connection; at stdin's end (or a failed write) it
// half-closes the connection, and PID 1 then ends it.
static void *stdin_to_socket(void *arg) {
	static char buf[BUF_SIZE];
	int fd = *(int *)arg;
	for (;;) {
		ssize_t n = read(0, buf, sizeof buf);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0 || write_all(fd, buf, (size_t)n, 1) != 0) {
			break;
		}
	}
	shutdown(fd, SHUT_WR);
	return NULL;
}

int main(int argc, char **argv) {
	// The relay of the runtime's own stream: nothing in the box may trace or read it, and it
	// needs no privilege at all.
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	int err = clear_caps();
	if (err != 0) {
		return fail("dropping capabilities", err);
	}
	// A write to a stdout the host closed fails with EPIPE and ends the relay.
	signal(SIGPIPE, SIG_IGN);

	const char *key_file = NULL;
	if (argc == 3 && strcmp(argv[1], provision_arg) == 0 && argv[2][0] != 0) {
		key_file = argv[2];
	} else if (argc != 1) {
		dprintf(2, "usage: sandbox-connect [%s KEYFILE]\n", provision_arg);
		return 2;
	}
	const char *name = getenv("SBX_SOCKET");
	if (name == NULL || name[0] == 0) {
		name = default_socket;
	}
	struct sockaddr_un sa;
	socklen_t len;
	if ((err = address(name, &sa, &len)) != 0) {
		return fail("the socket's name (SBX_SOCKET)", err);
	}

	int fd = -1;
	if (key_file != NULL && (fd = provision(key_file, &sa, len)) == -2) {
		return 1;
	}
	long long deadline = now_ms() + WAIT_MS;
	while (fd < 0) {
		fd = dial(&sa, len);
		if (fd >= 0) {
			break;
		}
		int e = errno;
		if (now_ms() > deadline) {
			return fail("dialing the init", e);
		}
		struct timespec step = {0, RETRY_MS * 1000000L};
		nanosleep(&step, NULL);
	}
	// PID 1 listens, so it took its key: whatever is left of the file is stale.
	if (key_file != NULL && unlink(key_file) < 0 && errno != ENOENT) {
		return fail("removing the key file", errno);
	}
	// Tell the host the init is up before any protocol byte.
	const char ready = READY;
	if (write_all(1, &ready, 1, 0) != 0) {
		return 1;
	}
	pthread_t t;
	if ((err = pthread_create(&t, NULL, stdin_to_socket, &fd)) != 0) {
		return fail("starting the stdin relay", err);
	}
	// The connection to stdout until PID 1 closes it or the host stops reading; the exit
	// ends the other relay too.
	static char buf[BUF_SIZE];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0 || write_all(1, buf, (size_t)n, 0) != 0) {
			break;
		}
	}
	return 0;
}
