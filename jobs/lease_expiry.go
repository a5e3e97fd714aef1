package jobs

import "github.com/riverqueue/river"

// Lease expiry: attempts whose lease lapsed are released, so another worker
// can reclaim the execution. Kinds are stored in river_job.kind: never
// rename them.
const (
	KindLeaseExpiryTick = "ff.lease_expiry.tick"
	KindLeaseExpiryScan = "ff.lease_expiry.scan"
	KindLeaseRelease    = "ff.lease_expiry.release"
)

// LeaseExpiryTickArgs is the periodic lease-expiry tick.
type LeaseExpiryTickArgs struct{}

// Kind implements river.JobArgs.
func (LeaseExpiryTickArgs) Kind() string { return KindLeaseExpiryTick }

// LeaseExpiryScanArgs scans one partition for expired leases.
type LeaseExpiryScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (LeaseExpiryScanArgs) Kind() string { return KindLeaseExpiryScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (LeaseExpiryScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// LeaseReleaseArgs releases one attempt's expired lease.
type LeaseReleaseArgs struct {
	Partition    int16  `json:"partition" river:"unique"`
	ExecutionID  string `json:"execution_id" river:"unique"`
	AttemptIndex int32  `json:"attempt_index" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (LeaseReleaseArgs) Kind() string { return KindLeaseRelease }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (LeaseReleaseArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a LeaseReleaseArgs) Validate() error {
	return validateRow(a.Partition, "execution_id", a.ExecutionID)
}
