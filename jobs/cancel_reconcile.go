package jobs

import "github.com/riverqueue/river"

// Sibling-cancel reconciler: stale pending cancel rows the dispatcher leaves
// are cleared. Kinds are stored in river_job.kind: never rename them.
const (
	KindCancelReconcileTick = "ff.cancel_reconcile.tick"
	KindCancelReconcileScan = "ff.cancel_reconcile.scan"
	KindCancelReconcile     = "ff.cancel_reconcile.reconcile"
)

// CancelReconcileTickArgs is the periodic stale-pending-row reconciler tick.
type CancelReconcileTickArgs struct{}

// Kind implements river.JobArgs.
func (CancelReconcileTickArgs) Kind() string { return KindCancelReconcileTick }

// CancelReconcileScanArgs scans one partition's pending cancel groups for
// stale rows.
type CancelReconcileScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (CancelReconcileScanArgs) Kind() string { return KindCancelReconcileScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelReconcileScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// CancelReconcileArgs reconciles one pending cancel group.
type CancelReconcileArgs CancelGroupArgs

// Kind implements river.JobArgs.
func (CancelReconcileArgs) Kind() string { return KindCancelReconcile }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelReconcileArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a CancelReconcileArgs) Validate() error { return CancelGroupArgs(a).Validate() }
