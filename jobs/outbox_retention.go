package jobs

import "github.com/riverqueue/river"

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

// InsertOpts implements river.JobArgsWithInsertOpts: at most one
// unfinished, on the trims' queue.
func (OutboxTrimArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueTrims,
		MaxAttempts: TickMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByState: UnfinishedStates},
	}
}
