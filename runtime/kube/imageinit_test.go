package kube_test

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/kubetest"
	"sandboxd/runtime"
	"sandboxd/runtime/kube"
	"sandboxd/runtime/runtimetest"
)

// initSpec is spec over the same image, which carries the guest init: no init container.
var initSpec = func() runtime.BoxSpec { s := spec; s.ImageHasInit = true; return s }()

// TestConformanceImageHasInit runs the conformance suite on pods whose image carries the init.
func TestConformanceImageHasInit(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return newDriver(t, cfg) }, initSpec)
}

// TestImageInitKeyStaysOut: a box whose pod has no init container gets its key on the first
// attach, and nothing of the workload finds it afterwards: not in the run folder, not in any
// process's environment, not in the pod's spec. A workload that replaces /.sbx/connect and
// /.sbx/init (the image's files, writable by the box's root) with programs recording their
// stdin and arguments then sees a later attach (another replica's, which brings no key) pass
// through them, never the key; the attach works through a faithful relay, as for any box.
func TestImageInitKeyStaysOut(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, initSpec)
	name, _ := kube.ObjectName(id)
	pod, err := c.Clientset(t).CoreV1().Pods(kubetest.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("the pod has init containers: %+v", pod.Spec.InitContainers)
	}
	key := pod.Annotations[kube.AnnChannelKey]
	if _, err := proto.ParseChannelKey(key); err != nil || pod.Annotations[kube.AnnChannelReady] != "true" {
		t.Fatalf("pod annotations %v: want a channel key marked ready", pod.Annotations)
	}

	cl := runtimetest.Client(t, d, id)
	look := runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"sh", "-c",
		"ls -a /run/sbx; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; env; grep -rl . /run/sbx 2>/dev/null | head -50; cat /proc/1/environ"}})
	if strings.Contains(string(look.Stdout)+string(look.Stderr), key) {
		t.Errorf("the workload finds the channel key: %s %s", look.Stdout, look.Stderr)
	}
	if strings.Contains(string(look.Stdout), "channel.key") {
		t.Errorf("a key file is left in the run folder: %s", look.Stdout)
	}

	// The workload puts recorders in the place of the image's attach programs.
	runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"sh", "-c", `set -e
for p in connect init; do
cp /.sbx/$p /tmp/real-$p
cat > /tmp/fake-$p <<EOF
#!/bin/sh
echo "\$0 \$@" >> /workspace/args
tee -a /workspace/stolen | /tmp/real-$p "\$@"
EOF
chmod 755 /tmp/fake-$p
cp /tmp/fake-$p /.sbx/$p.new && mv /.sbx/$p.new /.sbx/$p
done`}})

	// Another replica: no spare, no provisioning; it attaches through the recorder.
	d2 := newDriver(t, cfg)
	res := runtimetest.MustRun(t, runtimetest.Client(t, d2, id), proto.ExecRequest{Argv: []string{"sh", "-c", "cat /workspace/args; echo ---; cat /workspace/stolen | od -An -tx1 | tr -d ' \\n'"}})
	out := string(res.Stdout)
	args, stolen, _ := strings.Cut(out, "---")
	if !strings.Contains(args, "/.sbx/connect") {
		t.Fatalf("the recorder did not run (args %q): the test shows nothing", args)
	}
	if strings.Contains(args, proto.ConnectProvision) {
		t.Errorf("a later attach asked to provision: args %q", args)
	}
	// The key must appear neither as its hex text nor as bytes in what passed through.
	if strings.Contains(stolen, hex.EncodeToString([]byte(key))) || strings.Contains(stolen, key) {
		t.Errorf("the recorder saw the channel key")
	}
}

// TestAttachWithoutConnectProgram: a box whose image has no connect program (one made before
// it existed; here the workload deleted it) is attached to with the init's connect: another
// replica's attach runs it and works. The program is what every attach runs otherwise, for
// both kinds of pod: the live attach's process in the box is /.sbx/connect.
func TestAttachWithoutConnectProgram(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	for _, tc := range []struct {
		name string
		spec runtime.BoxSpec
		// ownCopy: the program is the image's own file, which the box's root can remove;
		// else the init container's copy, in a folder read-only in the sandbox container.
		ownCopy bool
	}{{"init container", spec, false}, {"image has init", initSpec, true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, cfg)
			id := runtimetest.CreateBox(t, d, tc.spec)
			cl := runtimetest.Client(t, d, id)
			// The command lines of the box's attach processes (the exec's own shell excluded).
			attaches := func(cl *client.Client) string {
				t.Helper()
				res := runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"sh", "-c",
					`for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in "/.sbx/connect "*|"/.sbx/init connect"*) echo "$c";; esac; done`}})
				return strings.TrimSpace(string(res.Stdout))
			}
			// (The attach that provisioned the pod's key carries its arguments.)
			if got := attaches(cl); got != "/.sbx/connect" && got != "/.sbx/connect provision /run/sbx/channel.key" {
				t.Errorf("the attach's process: %q, want /.sbx/connect", got)
			}
			if !tc.ownCopy {
				// The workload cannot take the init container's copy away.
				res := runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"rm", "-f", "/.sbx/connect"}})
				if res.Exit.ExitCode == 0 {
					t.Errorf("the workload removed the init container's /.sbx/connect")
				}
				return
			}
			runtimetest.MustRun(t, cl, proto.ExecRequest{Argv: []string{"rm", "/.sbx/connect"}})
			cl2 := runtimetest.Client(t, newDriver(t, cfg), id)
			if got := attaches(cl2); !strings.Contains(got, "/.sbx/init connect") {
				t.Errorf("the attaches' processes without the program: %q, want the init's connect among them", got)
			}
			res := runtimetest.MustRun(t, cl2, proto.ExecRequest{Argv: []string{"echo", "ok"}})
			if string(res.Stdout) != "ok\n" {
				t.Errorf("exec through the init's connect: %q", res.Stdout)
			}
		})
	}
}

// TestImageInitUnprovisionedPod: a pod whose first attach never brought its key (a create or
// start cut short, here a pod made again with the key but without the ready mark) is not
// attached to (its PID 1 does not listen) and a start replaces it with one that works on the
// kept workspace.
func TestImageInitUnprovisionedPod(t *testing.T) {
	c := kubetest.Require(t)
	cfg, _ := c.Gateway(t)
	d := newDriver(t, cfg)
	id := runtimetest.CreateBox(t, d, initSpec)
	runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"sh", "-c", "echo kept > f"}})

	pods := c.Clientset(t).CoreV1().Pods(kubetest.Namespace)
	name, _ := kube.ObjectName(id)
	orig, err := pods.Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replacePod(t, c, id, func(p *corev1.Pod) {
		p.Annotations = map[string]string{kube.AnnChannelKey: orig.Annotations[kube.AnnChannelKey]}
	})
	rwc, err := d.Attach(ctx(t), id)
	if err == nil {
		rwc.Close()
		t.Fatal("Attach to a pod whose PID 1 never got its key: got a stream")
	}
	if !errors.Is(err, runtime.ErrNotRunning) || !strings.Contains(err.Error(), "channel key") {
		t.Errorf("Attach: got %v, want ErrNotRunning about the channel key", err)
	}
	if _, err := d.Start(ctx(t), id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	res := runtimetest.MustRun(t, runtimetest.Client(t, d, id), proto.ExecRequest{Argv: []string{"cat", "f"}})
	if string(res.Stdout) != "kept\n" {
		t.Errorf("after the start got %q, want the kept workspace", res.Stdout)
	}
	p, err := pods.Get(ctx(t), name, metav1.GetOptions{})
	if err != nil || p.UID == orig.UID || p.Annotations[kube.AnnChannelReady] != "true" {
		t.Errorf("after the start: pod %v (%v), want a new pod marked ready", p.Annotations, err)
	}
}
