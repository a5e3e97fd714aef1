package jobs

import (
	"fmt"

	"github.com/riverqueue/river"
)

// Sibling-cancel dispatch: pending cancel groups are drained, cancelling the
// siblings their quorum left over. Kinds are stored in river_job.kind: never
// rename them.
const (
	KindCancelDispatchTick = "ff.cancel_dispatch.tick"
	KindCancelDispatchScan = "ff.cancel_dispatch.scan"
	KindCancelDispatch     = "ff.cancel_dispatch.dispatch"
)

// CancelDispatchTickArgs is the periodic sibling-cancel dispatch tick.
type CancelDispatchTickArgs struct{}

// Kind implements river.JobArgs.
func (CancelDispatchTickArgs) Kind() string { return KindCancelDispatchTick }

// CancelDispatchScanArgs scans one partition's pending cancel groups.
type CancelDispatchScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (CancelDispatchScanArgs) Kind() string { return KindCancelDispatchScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelDispatchScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// CancelGroupArgs identifies one pending cancel group (an edge group): the
// args of both the dispatch and the reconcile row jobs.
type CancelGroupArgs struct {
	Partition     int16  `json:"partition" river:"unique"`
	FlowID        string `json:"flow_id" river:"unique"`
	DownstreamEID string `json:"downstream_eid" river:"unique"`
}

// Validate implements Validator.
func (a CancelGroupArgs) Validate() error {
	if err := validateRow(a.Partition, "flow_id", a.FlowID); err != nil {
		return err
	}
	if _, err := ParseUUID(a.DownstreamEID); err != nil {
		return fmt.Errorf("downstream_eid: %w", err)
	}
	return nil
}

// CancelDispatchArgs drains one pending cancel group.
type CancelDispatchArgs CancelGroupArgs

// Kind implements river.JobArgs.
func (CancelDispatchArgs) Kind() string { return KindCancelDispatch }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelDispatchArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a CancelDispatchArgs) Validate() error { return CancelGroupArgs(a).Validate() }
