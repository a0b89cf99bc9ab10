package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"
)

// checkPprofAddr accepts an empty address (profiles off) or host:port whose host is a
// loopback IP literal (127.0.0.0/8, ::1): profiles and the goroutine dump show what the
// process holds (keys in memory, request contents), so they are never served to a network.
// A name such as localhost is refused too: what it resolves to is not this file's to check.
func checkPprofAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("pprof_addr %q: want a loopback host:port such as 127.0.0.1:6060", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("pprof_addr %q: the port must be a number up to 65535", addr)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("pprof_addr %q must be a loopback address (127.0.0.1 or [::1] and a port): profiles show the process's memory", addr)
	}
	return nil
}

// pprofMux serves net/http/pprof's handlers under /debug/pprof/ and nothing else.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // and the named profiles: heap, goroutine, …
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// startPprof serves the profiles on addr (checked by checkPprofAddr), a listener apart from
// the API's; stop closes it.
func startPprof(addr string, log *slog.Logger) (stop func(), err error) {
	if err := checkPprofAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listen: %w", err)
	}
	srv := &http.Server{Handler: pprofMux(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server stopped", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx) // a running CPU profile or trace is cut short
		srv.Close()
		<-done
	}, nil
}
