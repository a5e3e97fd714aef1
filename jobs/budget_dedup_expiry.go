package jobs

import (
	"errors"

	"github.com/riverqueue/river"
)

// Budget dedup expiry: report_usage idempotency keys past their expiry are
// deleted. Its partitions are FlowFabric's budget partitions. Kinds are
// stored in river_job.kind: never rename them.
const (
	KindBudgetDedupExpiryTick = "ff.budget_dedup_expiry.tick"
	KindBudgetDedupExpiryScan = "ff.budget_dedup_expiry.scan"
	KindBudgetDedupDelete     = "ff.budget_dedup_expiry.delete"
)

// BudgetDedupExpiryTickArgs is the periodic budget-dedup-expiry tick.
type BudgetDedupExpiryTickArgs struct{}

// Kind implements river.JobArgs.
func (BudgetDedupExpiryTickArgs) Kind() string { return KindBudgetDedupExpiryTick }

// BudgetDedupExpiryScanArgs scans one budget partition for expired keys.
type BudgetDedupExpiryScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (BudgetDedupExpiryScanArgs) Kind() string { return KindBudgetDedupExpiryScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (BudgetDedupExpiryScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// BudgetDedupDeleteArgs deletes one expired dedup key.
type BudgetDedupDeleteArgs struct {
	Partition int16  `json:"partition" river:"unique"`
	DedupKey  string `json:"dedup_key" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (BudgetDedupDeleteArgs) Kind() string { return KindBudgetDedupDelete }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (BudgetDedupDeleteArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a BudgetDedupDeleteArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.DedupKey == "" {
		return errors.New("missing dedup_key")
	}
	return nil
}
