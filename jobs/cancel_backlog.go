package jobs

import "github.com/riverqueue/river"

// Cancel backlog: the headers FlowFabric's flow cancel leaves in
// ff_cancel_backlog are drained once their grace is over, their live
// members cancelled and every member acked (FlowFabric's
// cancel_reconciler, which its Postgres backend lacks). Kinds are stored in
// river_job.kind: never rename them.
const (
	KindCancelBacklogTick  = "ff.cancel_backlog.tick"
	KindCancelBacklogScan  = "ff.cancel_backlog.scan"
	KindCancelBacklogDrain = "ff.cancel_backlog.drain"
)

// CancelBacklogTickArgs is the periodic cancel backlog tick.
type CancelBacklogTickArgs struct{}

// Kind implements river.JobArgs.
func (CancelBacklogTickArgs) Kind() string { return KindCancelBacklogTick }

// CancelBacklogScanArgs scans one partition's cancel backlog headers past
// their grace.
type CancelBacklogScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (CancelBacklogScanArgs) Kind() string { return KindCancelBacklogScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelBacklogScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// CancelBacklogDrainArgs drains one flow's cancel backlog header.
type CancelBacklogDrainArgs struct {
	Partition int16  `json:"partition" river:"unique"`
	FlowID    string `json:"flow_id" river:"unique"`
}

// Kind implements river.JobArgs.
func (CancelBacklogDrainArgs) Kind() string { return KindCancelBacklogDrain }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelBacklogDrainArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a CancelBacklogDrainArgs) Validate() error {
	return validateRow(a.Partition, "flow_id", a.FlowID)
}
