package jobs

import "github.com/riverqueue/river"

// Suspension timeout: timed-out suspensions fail, cancel or expire their
// execution, or get a synthetic timeout signal. Kinds are stored in
// river_job.kind: never rename them.
const (
	KindSuspensionTimeoutTick = "ff.suspension_timeout.tick"
	KindSuspensionTimeoutScan = "ff.suspension_timeout.scan"
	KindSuspensionExpire      = "ff.suspension_timeout.expire"
)

// SuspensionTimeoutTickArgs is the periodic suspension-timeout tick.
type SuspensionTimeoutTickArgs struct{}

// Kind implements river.JobArgs.
func (SuspensionTimeoutTickArgs) Kind() string { return KindSuspensionTimeoutTick }

// SuspensionTimeoutScanArgs scans one partition for timed-out suspensions.
type SuspensionTimeoutScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (SuspensionTimeoutScanArgs) Kind() string { return KindSuspensionTimeoutScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (SuspensionTimeoutScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// SuspensionExpireArgs applies the timeout behaviour of one suspension.
type SuspensionExpireArgs struct {
	Partition   int16  `json:"partition" river:"unique"`
	ExecutionID string `json:"execution_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (SuspensionExpireArgs) Kind() string { return KindSuspensionExpire }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (SuspensionExpireArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a SuspensionExpireArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}
