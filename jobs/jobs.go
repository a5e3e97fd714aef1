// Package jobs defines the River job kinds and JSON args of the FlowFabric
// reconciler fleet. It is the public contract other services import to
// enqueue work (chiefly PromoteArgs, the ad-hoc delayed promotion), so it
// depends on nothing of this project and on nothing heavier than River.
//
// Every reconciler has the same three kinds of job:
//
//   - a tick, run periodically on the elected leader, that finds the
//     partitions holding due rows with one indexed query;
//   - a partition scan per such partition, unique among unfinished jobs, that
//     selects a batch of due rows oldest first and inserts one row job each;
//   - a row job that applies the reconciler's action to one row in one
//     transaction, re-checking its condition atomically with the change, so
//     running it twice changes nothing the second time.
//
// # Follow-up scans
//
// A partition has one scan queued or running at a time. A tick that finds
// the partition's scan still waiting in the queue leaves it at that: the scan
// has read nothing yet and will see what the tick saw. A scan that has
// already started (or waits to retry) may have read the partition before rows
// the tick found were there, so the tick enqueues a follow-up scan whose
// Follows is that job's id: a unique key of its own, held while the follow-up
// is unfinished. A follow-up's continuations keep its Follows.
//
// Offering the started scan's own key instead would make River's unique
// insert (INSERT … ON CONFLICT DO UPDATE) lock that job's row, which River's
// completer may be finalizing together with others in another order: a tick
// inserting a few hundred scans could deadlock with it.
package jobs

import (
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Reconciler names. A reconciler's kinds are "ff.<name>.<step>".
const (
	ReconcilerLeaseExpiry       = "lease_expiry"
	ReconcilerSuspensionTimeout = "suspension_timeout"
	ReconcilerDelayedPromotion  = "delayed_promotion"
	ReconcilerCancelDispatch    = "cancel_dispatch"
	ReconcilerCancelReconcile   = "cancel_reconcile"
)

// Reconcilers lists every reconciler name.
var Reconcilers = []string{
	ReconcilerLeaseExpiry, ReconcilerSuspensionTimeout, ReconcilerDelayedPromotion,
	ReconcilerCancelDispatch, ReconcilerCancelReconcile,
}

// Queues. Ticks and scans are few and must not wait behind a backlog of row
// actions, so they have a queue of their own.
const (
	QueueControl = "ff_control" // ticks and partition scans
	QueueRows    = "ff_rows"    // one job per row action
)

// Job kinds. These strings are stored in river_job.kind: never rename them.
const (
	KindLeaseExpiryTick = "ff.lease_expiry.tick"
	KindLeaseExpiryScan = "ff.lease_expiry.scan"
	KindLeaseRelease    = "ff.lease_expiry.release"

	KindSuspensionTimeoutTick = "ff.suspension_timeout.tick"
	KindSuspensionTimeoutScan = "ff.suspension_timeout.scan"
	KindSuspensionExpire      = "ff.suspension_timeout.expire"

	KindDelayedPromotionTick = "ff.delayed_promotion.tick"
	KindDelayedPromotionScan = "ff.delayed_promotion.scan"
	KindPromote              = "ff.delayed_promotion.promote"

	KindCancelDispatchTick = "ff.cancel_dispatch.tick"
	KindCancelDispatchScan = "ff.cancel_dispatch.scan"
	KindCancelDispatch     = "ff.cancel_dispatch.dispatch"

	KindCancelReconcileTick = "ff.cancel_reconcile.tick"
	KindCancelReconcileScan = "ff.cancel_reconcile.scan"
	KindCancelReconcile     = "ff.cancel_reconcile.reconcile"
)

// UnfinishedStates is the uniqueness scope of scans and row jobs: a key is
// taken only while a job with it can still run. River's default also includes
// completed (kept for the retention period), which would silently drop a
// second, legitimate action on the same row after the first one finished.
// retryable is included so a row whose action keeps failing holds one job in
// backoff instead of gaining another one every tick.
var UnfinishedStates = []rivertype.JobState{
	rivertype.JobStateAvailable,
	rivertype.JobStatePending,
	rivertype.JobStateRunning,
	rivertype.JobStateRetryable,
	rivertype.JobStateScheduled,
}

// Attempts. A tick that fails is replaced by the next tick; a scan is cheap to
// retry; a row action that fails a few times (a lock timeout, a deadlock
// victim) is retried with backoff and, once discarded, picked up again by a
// later scan if the row is still due.
const (
	TickMaxAttempts = 1
	ScanMaxAttempts = 3
	RowMaxAttempts  = 5
)

// ScanPriority is the River priority of partition scans. Ticks keep River's
// default (1), so River fetches a tick before the scans still queued from
// the previous one: a late tick delays every row it would find, a late scan
// only its partition's.
const ScanPriority = 2

func scanOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueControl,
		Priority:    ScanPriority,
		MaxAttempts: ScanMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true, ByState: UnfinishedStates},
	}
}

func rowOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueRows,
		MaxAttempts: RowMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true, ByState: UnfinishedStates},
	}
}

// TickInsertOpts are the insert options of a reconciler's periodic tick.
// ByPeriod uniqueness makes a leader change neither skip nor double a tick.
func TickInsertOpts(interval time.Duration) *river.InsertOpts {
	return &river.InsertOpts{
		Queue:       QueueControl,
		MaxAttempts: TickMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByPeriod: interval},
	}
}

// ScanCursor continues a partition scan after the last row of a full batch,
// in the scan's order (deadline, then row key), so a backlog larger than one
// batch drains without waiting for the next tick. A tick also starts the scan
// of a partition whose due rows are all still queued after them (at_ms: the
// tick's now − 1, the largest ids), so it enqueues only rows falling due
// later.
type ScanCursor struct {
	AtMs int64  `json:"at_ms"`         // deadline of the last row
	ID   string `json:"id"`            // execution_id, or flow_id for cancel groups
	ID2  string `json:"id2,omitempty"` // downstream_eid for cancel groups
	N    int32  `json:"n,omitempty"`   // attempt_index for leases
}

// ---- lease expiry ----

// LeaseExpiryTickArgs is the periodic lease-expiry tick.
type LeaseExpiryTickArgs struct{}

// Kind implements river.JobArgs.
func (LeaseExpiryTickArgs) Kind() string { return KindLeaseExpiryTick }

// LeaseExpiryScanArgs scans one partition for expired leases.
type LeaseExpiryScanArgs struct {
	Partition int16       `json:"partition" river:"unique"`
	After     *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

// Kind implements river.JobArgs.
func (LeaseExpiryScanArgs) Kind() string { return KindLeaseExpiryScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (LeaseExpiryScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// LeaseReleaseArgs releases one attempt's expired lease.
type LeaseReleaseArgs struct {
	Partition    int16  `json:"partition" river:"unique"`
	ExecutionID  string `json:"execution_id" river:"unique"`
	AttemptIndex int32  `json:"attempt_index" river:"unique"`
	// DeadlineMs is the lease expiry the scan saw (Unix ms; 0: unknown),
	// not part of the unique key: a job started up to 5 s before it snoozes
	// until just after it, and it feeds the lateness metric. The action
	// re-checks the lease itself either way.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (LeaseReleaseArgs) Kind() string { return KindLeaseRelease }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (LeaseReleaseArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// ---- suspension timeout ----

// SuspensionTimeoutTickArgs is the periodic suspension-timeout tick.
type SuspensionTimeoutTickArgs struct{}

// Kind implements river.JobArgs.
func (SuspensionTimeoutTickArgs) Kind() string { return KindSuspensionTimeoutTick }

// SuspensionTimeoutScanArgs scans one partition for timed-out suspensions.
type SuspensionTimeoutScanArgs struct {
	Partition int16       `json:"partition" river:"unique"`
	After     *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

// Kind implements river.JobArgs.
func (SuspensionTimeoutScanArgs) Kind() string { return KindSuspensionTimeoutScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (SuspensionTimeoutScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// SuspensionExpireArgs applies the timeout behaviour of one suspension.
type SuspensionExpireArgs struct {
	Partition   int16  `json:"partition" river:"unique"`
	ExecutionID string `json:"execution_id" river:"unique"`
	// DeadlineMs is the timeout the scan saw (Unix ms; 0: unknown), not part
	// of the unique key: a job started up to 5 s before it snoozes until
	// just after it, and it feeds the lateness metric. The action re-checks
	// the suspension itself either way.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (SuspensionExpireArgs) Kind() string { return KindSuspensionExpire }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (SuspensionExpireArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// ---- delayed promotion ----

// DelayedPromotionTickArgs is the periodic delayed-promotion sweep tick.
type DelayedPromotionTickArgs struct{}

// Kind implements river.JobArgs.
func (DelayedPromotionTickArgs) Kind() string { return KindDelayedPromotionTick }

// DelayedPromotionScanArgs scans one partition for delayed executions whose
// delay has elapsed.
type DelayedPromotionScanArgs struct {
	Partition int16       `json:"partition" river:"unique"`
	After     *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

// Kind implements river.JobArgs.
func (DelayedPromotionScanArgs) Kind() string { return KindDelayedPromotionScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DelayedPromotionScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// ---- sibling-cancel dispatch and its reconciler ----

// CancelDispatchTickArgs is the periodic sibling-cancel dispatch tick.
type CancelDispatchTickArgs struct{}

// Kind implements river.JobArgs.
func (CancelDispatchTickArgs) Kind() string { return KindCancelDispatchTick }

// CancelDispatchScanArgs scans one partition's pending cancel groups.
type CancelDispatchScanArgs struct {
	Partition int16       `json:"partition" river:"unique"`
	After     *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

// Kind implements river.JobArgs.
func (CancelDispatchScanArgs) Kind() string { return KindCancelDispatchScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelDispatchScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// CancelGroupArgs identifies one pending cancel group (an edge group).
type CancelGroupArgs struct {
	Partition     int16  `json:"partition" river:"unique"`
	FlowID        string `json:"flow_id" river:"unique"`
	DownstreamEID string `json:"downstream_eid" river:"unique"`
}

// CancelDispatchArgs drains one pending cancel group.
type CancelDispatchArgs CancelGroupArgs

// Kind implements river.JobArgs.
func (CancelDispatchArgs) Kind() string { return KindCancelDispatch }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelDispatchArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// CancelReconcileTickArgs is the periodic stale-pending-row reconciler tick.
type CancelReconcileTickArgs struct{}

// Kind implements river.JobArgs.
func (CancelReconcileTickArgs) Kind() string { return KindCancelReconcileTick }

// CancelReconcileScanArgs scans one partition's pending cancel groups for
// stale rows.
type CancelReconcileScanArgs struct {
	Partition int16       `json:"partition" river:"unique"`
	After     *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

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
