package sandbox

import (
	"maps"

	"sandboxd/internal/checkpoint"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

func entryOf(rec runtime.Record) store.Entry {
	return store.Entry{ID: rec.ID, Tenant: rec.Tenant, Project: rec.Project, State: rec.State,
		Profile: rec.Spec.Profile, CreatedAt: rec.CreatedAt, Labels: rec.Labels}
}

// EntryOf converts a runtime box to its lookup entry (the store's rebuild source).
func EntryOf(b runtime.Box) store.Entry { return entryOf(b.Record) }

func scopeOf(rec runtime.Record) checkpoint.Scope {
	return checkpoint.Scope{Tenant: rec.Tenant, Project: rec.Project, Sandbox: rec.ID}
}

func toSandbox(rec runtime.Record) Sandbox {
	return Sandbox{ID: rec.ID, Tenant: rec.Tenant, Project: rec.Project, Profile: rec.Spec.Profile,
		State: State(rec.State), StateReason: rec.StateReason, CreatedAt: rec.CreatedAt, StateChangedAt: rec.StateChangedAt,
		AutostopSec: rec.AutostopSec, TTLSec: rec.TTLSec, LatestSnapshotID: rec.LatestCheckpoint,
		MilliCPU: rec.Spec.MilliCPU, MemoryBytes: rec.Spec.MemoryBytes, DiskBytes: rec.Spec.DiskBytes, Network: network(rec.Spec.Network),
		NetworkPolicy: policyOf(rec.Spec.Network, rec.Spec.NetworkPolicy), Labels: maps.Clone(rec.Labels),
		AutostopAction: autostopAction(rec), AutoResume: rec.Annotations[annAutoResume] == "true"}
}

// autostopAction is the record's auto-stop action, "stop" unless it says "pause".
func autostopAction(rec runtime.Record) string {
	if rec.Annotations[annAutostopAction] == AutostopPause {
		return AutostopPause
	}
	return AutostopStop
}
