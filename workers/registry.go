package workers

import (
	"slices"
	"time"
)

// registry lists every reconciler once, in the order they are shown. Adding
// a reconciler is its args (jobs/<name>.go), its store file (the Due and the
// row statement), its workers file (its value, built by define, with its
// settings, queue and side channel), a migrations file when it needs
// objects of ours in the database, and a line here; every other part of the
// program walks this list (TestEveryReconcilerIsNamedOnlyInItsOwnFiles).
// The tests walk it too, and fail until the new reconciler has its case in
// each suite that proves something of every reconciler: its due rows
// (store's dueCases), a row falling due (workers' deadlineRows), another
// tenant's rows (tenantFixtures), a bad raw job of each kind, and the
// demo's rows with their check (internal/demo, cmd/worker's demo test).
var registry = []*Reconciler{
	LeaseExpiry,
	SuspensionTimeout,
	DelayedPromotion,
	CancelDispatch,
	CancelReconcile,
	CancelBacklog,
	AttemptTimeout,
	ExecutionDeadline,
	WaitpointExpiry,
	BudgetReset,
	ClaimGrantExpiry,
	QuotaReconcile,
	BudgetDedupExpiry,
	WorkerRegistryTTL,
	Dependency,
	Retention,
	OutboxRetention,
	FlowSummary,
}

// All returns every reconciler, in the registry's order.
func All() []*Reconciler { return slices.Clone(registry) }

// DefaultOn returns the reconcilers a fleet with settings v runs unless
// told otherwise, in the registry's order: all of them, but those turned
// on by a setting (Reconciler.OnlyWith) only with that setting on.
func DefaultOn(v Values) []*Reconciler {
	var out []*Reconciler
	for _, r := range registry {
		if r.On(v) {
			out = append(out, r)
		}
	}
	return out
}

// AllTenantsOf returns the names of the reconcilers among enabled (by
// name) that act on every tenant's rows whatever the tenant filter
// (Reconciler.AllTenants), in the registry's order.
func AllTenantsOf(enabled map[string]time.Duration) []string {
	var out []string
	for _, r := range registry {
		if _, ok := enabled[r.Name]; ok && r.AllTenants {
			out = append(out, r.Name)
		}
	}
	return out
}

// Names returns every reconciler's name, in the registry's order.
func Names() []string {
	names := make([]string, len(registry))
	for i, r := range registry {
		names[i] = r.Name
	}
	return names
}

// ByName returns the reconciler named name.
func ByName(name string) (*Reconciler, bool) {
	for _, r := range registry {
		if r.Name == name {
			return r, true
		}
	}
	return nil, false
}

// Step is what a job of a reconciler does: tick, scan or row.
type Step string

// Steps.
const (
	StepTick Step = "tick"
	StepScan Step = "scan"
	StepRow  Step = "row"
)

type kindOf struct {
	r    *Reconciler
	step Step
}

var byKind = func() map[string]kindOf {
	m := map[string]kindOf{}
	for _, r := range registry {
		m[r.tickKind] = kindOf{r, StepTick}
		if r.scanKind != "" {
			m[r.scanKind] = kindOf{r, StepScan}
		}
		if r.HasRowJobs() {
			m[r.rowKind] = kindOf{r, StepRow}
		}
	}
	return m
}()

// ByKind returns the reconciler a job kind belongs to, and the job's step.
func ByKind(kind string) (*Reconciler, Step, bool) {
	k, ok := byKind[kind]
	return k.r, k.step, ok
}
