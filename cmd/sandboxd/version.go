package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"sandboxd/internal/version"
)

// isVersionArg reports the arguments that ask for the version: `sandboxd version`,
// `sandboxd --version`, `sandboxd -version`.
func isVersionArg(arg string) bool {
	return arg == "version" || arg == "--version" || arg == "-version"
}

// versionDetail is the line /readyz adds to its answer, ready or not.
func versionDetail() string {
	return fmt.Sprintf("version %s revision %s %s", version.Version, version.Revision(), version.GoVersion())
}

// buildInfo is sandboxd_build_info{version,revision,goversion} 1: which build a replica runs,
// for dashboards and for alerts on replicas of mixed versions.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sandboxd_build_info",
		Help: "Always 1; the labels say which build this replica runs.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(version.Version, version.Revision(), version.GoVersion()).Set(1)
	return g
}
