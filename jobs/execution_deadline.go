package jobs

import "github.com/riverqueue/river"

// Execution deadline: active executions past their deadline are made
// terminal. Kinds are stored in river_job.kind: never rename them.
const (
	KindExecutionDeadlineTick = "ff.execution_deadline.tick"
	KindExecutionDeadlineScan = "ff.execution_deadline.scan"
	KindDeadlineExpire        = "ff.execution_deadline.expire"
)

// ExecutionDeadlineTickArgs is the periodic execution-deadline tick.
type ExecutionDeadlineTickArgs struct{}

// Kind implements river.JobArgs.
func (ExecutionDeadlineTickArgs) Kind() string { return KindExecutionDeadlineTick }

// ExecutionDeadlineScanArgs scans one partition for executions past their
// deadline.
type ExecutionDeadlineScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (ExecutionDeadlineScanArgs) Kind() string { return KindExecutionDeadlineScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ExecutionDeadlineScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// DeadlineExpireArgs expires one execution past its deadline.
type DeadlineExpireArgs struct {
	Partition   int16  `json:"partition" river:"unique"`
	ExecutionID string `json:"execution_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (DeadlineExpireArgs) Kind() string { return KindDeadlineExpire }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DeadlineExpireArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a DeadlineExpireArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}
