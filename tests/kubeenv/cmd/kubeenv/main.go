// Command kubeenv runs a real, local Kubernetes cluster for tests, in the foreground:
// embedded etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a
// virtual-kubelet node (vknode) whose pods are real gVisor containers (or native runc
// containers, for RuntimeClass "runc"), all on 127.0.0.1.
//
//	kubeenv up --dir DIR --runsc PATH [--runc PATH] [--bin BINDIR] [--image NAME=ROOTFS ...] [--oci-layout DIR ...] [flags]
//	kubeenv down --dir DIR
//
// `up` makes a fresh cluster in DIR (it replaces what an earlier `up` left there):
//
//	DIR/pki/                 CA, certificates, keys, service account keys, token file
//	DIR/admin.kubeconfig     cluster-admin (client certificate in system:masters)
//	DIR/admin.token          a bearer token in system:masters (same rights)
//	DIR/etcd/                etcd's data
//	DIR/node/                the node's runsc and runc roots, pod folders and provisioned volumes (pv/)
//	DIR/logs/<name>.log      each program's output (kept after exit)
//	DIR/env                  shell variables: KUBECONFIG=..., KUBEENV_SERVER=..., KUBEENV_PID=...
//	DIR/pid                  the supervisor's pid
//	DIR/ready                written last, once the cluster is ready (removed on exit)
//
// Once ready it prints "KUBECONFIG=DIR/admin.kubeconfig" (and a summary) on stdout; progress
// goes to stderr. On SIGTERM or SIGINT it stops every child by its pid (SIGTERM, SIGKILL
// after 5 s; the node first, so it deletes its containers), removes any runsc or runc
// container left in DIR/node and exits 0. If a child exits on its own it prints the tail of
// its log and exits 1. `down` sends SIGTERM to the supervisor whose pid DIR/pid holds and
// waits for it to exit.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandboxd/tests/kubeenv/internal/runc"
)

func init() {
	// Children are started from the main goroutine, which stays on the main thread: their
	// parent-death signal (Pdeathsig) follows the thread that forked them, and the main
	// thread lives as long as the process.
	goruntime.LockOSThread()
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		usage()
	}
	if err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage:\n  kubeenv up --dir DIR --runsc PATH [--runc PATH] [--bin BINDIR] [--image NAME=ROOTFS ...] [--oci-layout DIR ...] [flags]\n  kubeenv down --dir DIR\nrun `kubeenv up -h` for the flags\n")
	os.Exit(2)
}

// logf prints a progress line on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[kubeenv %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// config is what `up` was asked for.
type config struct {
	dir, bin, runscPath, platform string
	images, layouts               multiFlag
	nodeName, storageClass        string
	runtimeClass                  string
	runcPath, runcRuntimeClass    string
	apiserverPort, etcdPort       int
	etcdPeerPort, kubeletPort     int
	cmPort, schedulerPort         int
	verbosity                     int
	timeout                       time.Duration
}

// programs are the binaries `up` needs in --bin.
var programs = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "vknode"}

func up(args []string) error {
	var c config
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	fs.StringVar(&c.dir, "dir", "", "the cluster's folder (required; what an earlier up left there is replaced)")
	fs.StringVar(&c.bin, "bin", "", "folder of the binaries: "+strings.Join(programs, ", ")+" (default: kubeenv's own folder)")
	fs.StringVar(&c.runscPath, "runsc", "", "runsc binary (required)")
	fs.StringVar(&c.platform, "platform", "systrap", "runsc --platform")
	fs.Var(&c.images, "image", "NAME=ROOTFS: the node runs image NAME from the rootfs folder ROOTFS (repeatable)")
	fs.Var(&c.layouts, "oci-layout", "DIR: the node unpacks the images of this OCI image layout (named by org.opencontainers.image.ref.name) and runs them (repeatable)")
	fs.StringVar(&c.nodeName, "node-name", "sandbox-node", "name of the node")
	fs.StringVar(&c.storageClass, "storage-class", "sandbox-local", "StorageClass created as the default class, served by the node's hostPath provisioner")
	fs.StringVar(&c.runtimeClass, "runtime-class", "", "also create a RuntimeClass of this name with handler runsc (default: none)")
	fs.StringVar(&c.runcRuntimeClass, "runc-runtime-class", "runc", "create a RuntimeClass of this name with handler runc, whose pods the node runs natively with runc (empty: none, and the node runs no runc)")
	fs.StringVar(&c.runcPath, "runc", "", "runc binary (default: runc on $PATH, else "+runc.DefaultPath+"; Debian package runc)")
	fs.IntVar(&c.apiserverPort, "apiserver-port", 16443, "kube-apiserver port on 127.0.0.1")
	fs.IntVar(&c.etcdPort, "etcd-port", 12379, "etcd client port")
	fs.IntVar(&c.etcdPeerPort, "etcd-peer-port", 12380, "etcd peer port")
	fs.IntVar(&c.kubeletPort, "kubelet-port", 16250, "the node's kubelet API port")
	fs.IntVar(&c.cmPort, "controller-manager-port", 16257, "kube-controller-manager secure port")
	fs.IntVar(&c.schedulerPort, "scheduler-port", 16259, "kube-scheduler secure port")
	fs.IntVar(&c.verbosity, "v", 0, "log verbosity of the Kubernetes programs")
	fs.DurationVar(&c.timeout, "timeout", 90*time.Second, "how long the cluster may take to become ready")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.dir == "" || c.runscPath == "" {
		return errors.New("--dir and --runsc are required")
	}
	var err error
	if c.dir, err = filepath.Abs(c.dir); err != nil {
		return err
	}
	if c.bin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		c.bin = filepath.Dir(self)
	}
	for _, p := range programs {
		if fi, err := os.Stat(filepath.Join(c.bin, p)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing in %s (build them with scripts/ensure-kubeenv.sh)", p, c.bin)
		}
	}
	if _, err := os.Stat(c.runscPath); err != nil {
		return fmt.Errorf("--runsc: %w", err)
	}
	if c.runcRuntimeClass != "" {
		if c.runcPath == "" {
			c.runcPath = findRunc()
		}
		if c.runcPath == "" {
			return fmt.Errorf("runc is not installed (Debian package runc; scripts/ensure-kubeenv.sh installs it): pass --runc PATH, or --runc-runtime-class= for a node without runc")
		}
		if _, err := os.Stat(c.runcPath); err != nil {
			return fmt.Errorf("--runc: %w", err)
		}
	}
	for _, kv := range c.images {
		name, dir, ok := strings.Cut(kv, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("--image %q: want NAME=ROOTFS", kv)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("--image %s: %s is not a folder", name, dir)
		}
	}
	for i, l := range c.layouts {
		if _, err := os.Stat(filepath.Join(l, "index.json")); err != nil {
			return fmt.Errorf("--oci-layout %s: not an OCI image layout: %w", l, err)
		}
		if c.layouts[i], err = filepath.Abs(l); err != nil {
			return err
		}
	}
	for _, port := range []int{c.apiserverPort, c.etcdPort, c.etcdPeerPort, c.kubeletPort, c.cmPort, c.schedulerPort} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("port %d on 127.0.0.1 is not free (another cluster running? see the --*-port flags): %w", port, err)
		}
		l.Close()
	}
	s := &supervisor{cfg: c, start: time.Now()}
	return s.run()
}

// findRunc returns runc on $PATH, else Debian's /usr/sbin/runc (often not on a user's
// $PATH), else "".
func findRunc() string {
	if p, err := exec.LookPath("runc"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	if fi, err := os.Stat(runc.DefaultPath); err == nil && fi.Mode()&0o111 != 0 {
		return runc.DefaultPath
	}
	return ""
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// isSupervisor reports whether pid is a running `kubeenv up`.
func isSupervisor(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) >= 2 && filepath.Base(args[0]) == "kubeenv" && args[1] == "up"
}

// down stops the supervisor of a folder (SIGTERM by the pid in DIR/pid) and waits for it.
func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", "", "the cluster's folder (required)")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for the supervisor to exit")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("--dir is required")
	}
	pid := readPid(filepath.Join(*dir, "pid"))
	if pid <= 0 || !isSupervisor(pid) {
		logf("no kubeenv supervisor runs on %s", *dir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(*timeout)
	for isSupervisor(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("supervisor pid %d still runs after %s", pid, *timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	logf("supervisor pid %d stopped", pid)
	return nil
}
