package jobs

import "github.com/riverqueue/river"

// Retention: ended executions (terminal or cancelled) older than the
// fleet's retention are deleted with their sibling rows, a partition's batch per transaction
// (FlowFabric's trim_retention). Off unless the fleet is started with a
// retention. Kinds are stored in river_job.kind: never rename them.
const (
	KindRetentionTick = "ff.retention.tick"
	KindRetentionTrim = "ff.retention.trim"
)

// RetentionTickArgs is the periodic retention tick.
type RetentionTickArgs struct{}

// Kind implements river.JobArgs.
func (RetentionTickArgs) Kind() string { return KindRetentionTick }

// RetentionTrimArgs trims one partition's ended executions past the
// retention: the partition's scan, which does the deleting itself, in
// batches (there is no per-execution job; see docs/design.md,
// "Retention"). After is unused: a trim always starts from the partition's
// oldest.
type RetentionTrimArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (RetentionTrimArgs) Kind() string { return KindRetentionTrim }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (RetentionTrimArgs) InsertOpts() river.InsertOpts {
	o := scanOpts()
	o.Queue = QueueTrims
	return o
}
