// Command etcd is a single-member etcd for the test cluster: go.etcd.io/etcd/server/v3/embed
// with the few settings a throw-away cluster needs (loopback URLs, no fsync, quiet logs).
//
//	etcd --data-dir DIR [--listen-client-url http://127.0.0.1:12379] [--listen-peer-url http://127.0.0.1:12380]
//
// It runs until SIGTERM or SIGINT, then closes the server cleanly and exits 0.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	dataDir := flag.String("data-dir", "", "data folder (required)")
	clientURL := flag.String("listen-client-url", "http://127.0.0.1:12379", "client URL to listen on and advertise")
	peerURL := flag.String("listen-peer-url", "http://127.0.0.1:12380", "peer URL to listen on and advertise")
	name := flag.String("name", "kubeenv", "member name")
	logLevel := flag.String("log-level", "warn", "log level: debug, info, warn, error")
	fsync := flag.Bool("fsync", false, "fsync writes (off by default: the data is throw-away)")
	flag.Parse()
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	curl, err := url.Parse(*clientURL)
	if err != nil {
		return fmt.Errorf("--listen-client-url: %w", err)
	}
	purl, err := url.Parse(*peerURL)
	if err != nil {
		return fmt.Errorf("--listen-peer-url: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = !*fsync
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}

	start := time.Now()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer e.Close()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready in %d ms, serving %s\n", time.Since(start).Milliseconds(), curl)
	case err := <-e.Err():
		return fmt.Errorf("serve: %w", err)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("not ready after 60 s")
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: %v before ready, stopping\n", s)
		return nil
	}
	select {
	case err := <-e.Err():
		return fmt.Errorf("serve: %w", err)
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: %v, stopping\n", s)
		return nil
	}
}
