package jobs

import (
	"fmt"

	"github.com/riverqueue/river"
)

// Dependency resolution: completion events nobody dispatched are dispatched
// with FlowFabric's cascade (edge groups advanced, downstreams made eligible
// or skipped, sibling-cancel groups queued). Kinds are stored in
// river_job.kind: never rename them.
const (
	KindDependencyTick     = "ff.dependency.tick"
	KindDependencyScan     = "ff.dependency.scan"
	KindDependencyDispatch = "ff.dependency.dispatch"
)

// DependencyTickArgs is the periodic dependency tick.
type DependencyTickArgs struct{}

// Kind implements river.JobArgs.
func (DependencyTickArgs) Kind() string { return KindDependencyTick }

// DependencyScanArgs scans one partition for undispatched completion events.
type DependencyScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (DependencyScanArgs) Kind() string { return KindDependencyScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DependencyScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// DependencyDispatchArgs dispatches one completion event: it claims the
// event and advances every edge out of its execution, in one transaction.
type DependencyDispatchArgs struct {
	Partition int16 `json:"partition" river:"unique"`
	// EventID is ff_completion_event.event_id, unique across partitions.
	EventID int64 `json:"event_id" river:"unique"`
}

// Kind implements river.JobArgs.
func (DependencyDispatchArgs) Kind() string { return KindDependencyDispatch }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (DependencyDispatchArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a DependencyDispatchArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.EventID < 1 {
		return fmt.Errorf("event_id %d: must be at least 1 (an ff_completion_event identity)", a.EventID)
	}
	return nil
}
