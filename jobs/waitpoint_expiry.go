package jobs

import "github.com/riverqueue/river"

// Waitpoint expiry: pending waitpoints whose expiry passed are closed, with
// a never_committed marker in their suspension's member_map. Kinds are
// stored in river_job.kind: never rename them.
const (
	KindWaitpointExpiryTick = "ff.waitpoint_expiry.tick"
	KindWaitpointExpiryScan = "ff.waitpoint_expiry.scan"
	KindWaitpointClose      = "ff.waitpoint_expiry.close"
)

// WaitpointExpiryTickArgs is the periodic waitpoint-expiry tick.
type WaitpointExpiryTickArgs struct{}

// Kind implements river.JobArgs.
func (WaitpointExpiryTickArgs) Kind() string { return KindWaitpointExpiryTick }

// WaitpointExpiryScanArgs scans one partition for expired waitpoints.
type WaitpointExpiryScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (WaitpointExpiryScanArgs) Kind() string { return KindWaitpointExpiryScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (WaitpointExpiryScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// WaitpointCloseArgs closes one expired waitpoint.
type WaitpointCloseArgs struct {
	Partition   int16  `json:"partition" river:"unique"`
	WaitpointID string `json:"waitpoint_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (WaitpointCloseArgs) Kind() string { return KindWaitpointClose }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (WaitpointCloseArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a WaitpointCloseArgs) Validate() error {
	return validateRow(a.Partition, "waitpoint_id", a.WaitpointID)
}
