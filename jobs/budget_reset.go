package jobs

import (
	"errors"

	"github.com/riverqueue/river"
)

// Budget reset: budgets whose next reset time has come have their usage
// zeroed and their next reset scheduled. Their partitions are FlowFabric's
// budget partitions (32 by default), not the flow partitions. Kinds are
// stored in river_job.kind: never rename them.
const (
	KindBudgetResetTick = "ff.budget_reset.tick"
	KindBudgetResetScan = "ff.budget_reset.scan"
	KindBudgetReset     = "ff.budget_reset.reset"
)

// BudgetResetTickArgs is the periodic budget-reset tick.
type BudgetResetTickArgs struct{}

// Kind implements river.JobArgs.
func (BudgetResetTickArgs) Kind() string { return KindBudgetResetTick }

// BudgetResetScanArgs scans one budget partition for due resets.
type BudgetResetScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (BudgetResetScanArgs) Kind() string { return KindBudgetResetScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (BudgetResetScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// BudgetResetArgs resets one budget.
type BudgetResetArgs struct {
	Partition int16  `json:"partition" river:"unique"`
	BudgetID  string `json:"budget_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (BudgetResetArgs) Kind() string { return KindBudgetReset }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (BudgetResetArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a BudgetResetArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.BudgetID == "" {
		return errors.New("missing budget_id")
	}
	return nil
}
