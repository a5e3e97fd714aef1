package jobs

import "github.com/riverqueue/river"

// Attempt timeout: attempts whose lease lapsed while their execution is
// active are interrupted, and the execution retried or, its retries
// exhausted, made terminal. Kinds are stored in river_job.kind: never
// rename them.
const (
	KindAttemptTimeoutTick = "ff.attempt_timeout.tick"
	KindAttemptTimeoutScan = "ff.attempt_timeout.scan"
	KindAttemptExpire      = "ff.attempt_timeout.expire"
)

// AttemptTimeoutTickArgs is the periodic attempt-timeout tick.
type AttemptTimeoutTickArgs struct{}

// Kind implements river.JobArgs.
func (AttemptTimeoutTickArgs) Kind() string { return KindAttemptTimeoutTick }

// AttemptTimeoutScanArgs scans one partition for timed-out attempts.
type AttemptTimeoutScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (AttemptTimeoutScanArgs) Kind() string { return KindAttemptTimeoutScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (AttemptTimeoutScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// AttemptExpireArgs applies the attempt timeout to one attempt.
type AttemptExpireArgs struct {
	Partition    int16  `json:"partition" river:"unique"`
	ExecutionID  string `json:"execution_id" river:"unique"`
	AttemptIndex int32  `json:"attempt_index" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key: a job started before it snoozes until just after
	// it. The fleet's scans leave it out (a value no other job has costs
	// river_job's GIN index over args an entry of its own): a row already
	// due gets none, and a row enqueued ahead a schedule 1 ms after its
	// deadline, which workers read as the deadline when this is 0 (as they
	// read any schedule a job was given at insert). Jobs of earlier
	// versions carry it. The action re-checks the attempt under its lock
	// either way, and the lateness metric measures from the lease expiry
	// it finds there.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (AttemptExpireArgs) Kind() string { return KindAttemptExpire }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (AttemptExpireArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a AttemptExpireArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}
