package jobs

import (
	"errors"

	"github.com/riverqueue/river"
)

// Quota reconcile: expired quota admissions are deleted, with their
// policy's window rows older than its window, and a capped policy's
// concurrency counter is set to its live admissions. Its partitions are
// FlowFabric's quota partitions (32 by default). Kinds are stored in
// river_job.kind: never rename them.
const (
	KindQuotaReconcileTick = "ff.quota_reconcile.tick"
	KindQuotaReconcileScan = "ff.quota_reconcile.scan"
	KindQuotaReconcile     = "ff.quota_reconcile.reconcile"
)

// QuotaReconcileTickArgs is the periodic quota-reconcile tick.
type QuotaReconcileTickArgs struct{}

// Kind implements river.JobArgs.
func (QuotaReconcileTickArgs) Kind() string { return KindQuotaReconcileTick }

// QuotaReconcileScanArgs scans one quota partition for expired admissions.
type QuotaReconcileScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (QuotaReconcileScanArgs) Kind() string { return KindQuotaReconcileScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (QuotaReconcileScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// QuotaReconcileArgs reconciles one expired admission and its policy.
type QuotaReconcileArgs struct {
	Partition     int16  `json:"partition" river:"unique"`
	QuotaPolicyID string `json:"quota_policy_id" river:"unique"`
	// ExecutionID is the admission's execution_id as FlowFabric stores it
	// (its wire id, text).
	ExecutionID string `json:"execution_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (QuotaReconcileArgs) Kind() string { return KindQuotaReconcile }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (QuotaReconcileArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a QuotaReconcileArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.QuotaPolicyID == "" {
		return errors.New("missing quota_policy_id")
	}
	if a.ExecutionID == "" {
		return errors.New("missing execution_id")
	}
	return nil
}
