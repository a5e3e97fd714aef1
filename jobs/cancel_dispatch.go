package jobs

import (
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

// CancelDispatchArgs drains one pending cancel group.
type CancelDispatchArgs CancelGroupArgs

// Kind implements river.JobArgs.
func (CancelDispatchArgs) Kind() string { return KindCancelDispatch }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (CancelDispatchArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a CancelDispatchArgs) Validate() error { return CancelGroupArgs(a).Validate() }
