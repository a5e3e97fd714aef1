package jobs

import "github.com/riverqueue/river"

// Retention: terminal executions older than the fleet's retention are
// deleted with their sibling rows, a partition's batch per transaction
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

// RetentionTrimArgs trims one partition's terminal executions past the
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
	o.Queue = QueueRetention
	return o
}

// Outbox retention: lease events and dispatched completion events older
// than the fleet's outbox retention are deleted, oldest first, whatever
// their execution's state. Off unless the fleet is started with an outbox
// retention. One job per tick: both outboxes are ordered by event id across
// partitions, so the trim walks them from the oldest without a fan-out.
const KindOutboxTrim = "ff.outbox_retention.trim"

// OutboxTrimArgs is the periodic outbox trim.
type OutboxTrimArgs struct{}

// Kind implements river.JobArgs.
func (OutboxTrimArgs) Kind() string { return KindOutboxTrim }

// OutboxTrimInsertOpts are the insert options of the periodic outbox trim:
// at most one unfinished, on the retention queue.
func OutboxTrimInsertOpts() *river.InsertOpts {
	return &river.InsertOpts{
		Queue:       QueueRetention,
		MaxAttempts: TickMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByState: UnfinishedStates},
	}
}
