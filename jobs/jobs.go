// Package jobs defines the River job kinds and JSON args of the FlowFabric
// reconciler fleet. It is the public contract other services import to
// enqueue work (chiefly PromoteArgs, the ad-hoc delayed promotion), so it
// depends on nothing of this project and on nothing heavier than River.
//
// Most reconcilers have the same three kinds of job, "ff.<reconciler>.<step>",
// declared in the reconciler's own file here:
//
//   - a tick ("ff.<reconciler>.tick"), run periodically on the elected
//     leader, that finds the partitions holding due rows with one indexed
//     query;
//   - a partition scan ("ff.<reconciler>.scan") per such partition, unique
//     among unfinished jobs, that selects a batch of due rows oldest first
//     and inserts one row job each (its args embed ScanArgs);
//   - a row job that applies the reconciler's action to one row in one
//     transaction, re-checking its condition atomically with the change, so
//     running it twice changes nothing the second time.
//
// Those that act on rows set-based have no row job: retention's partition
// job ("ff.retention.trim", in place of a scan) deletes its partition's
// rows itself, flow summary's ("ff.flow_summary.project") projects its
// partition's flows a batch per statement, and outbox retention's periodic
// job ("ff.outbox_retention.trim", in place of a tick) trims by itself.
//
// # Follow-up scans
//
// A partition has one scan queued or running at a time. A tick that finds
// the partition's scan still waiting in the queue leaves it at that: the scan
// has read nothing yet and will see what the tick saw. A scan that has
// already started (or waits to retry) may have read the partition before rows
// the tick found were there, so the tick enqueues a follow-up scan whose
// Follows is that job's id: a unique key of its own, held while the follow-up
// is unfinished. A follow-up's continuations keep its Follows.
//
// Offering the started scan's own key instead would make River's unique
// insert (INSERT … ON CONFLICT DO UPDATE) lock that job's row, which River's
// completer may be finalizing together with others in another order: a tick
// inserting a few hundred scans could deadlock with it.
package jobs

import (
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Queues. Ticks and scans are few and must not wait behind a backlog of row
// actions, so they have queues of their own; ticks have one apart from the
// scans, worked one at a time per process, so that ticks slowed down (a
// loaded server) can never hold every worker the scans need.
const (
	QueueTicks   = "ff_ticks"   // periodic ticks
	QueueControl = "ff_control" // partition scans
	QueueRows    = "ff_rows"    // one job per row action
	// QueueTrims holds long deletes (retention's partition trims, the
	// outbox trims), worked one at a time per process, so that trimming a
	// backlog never holds a worker another reconciler's scans or rows need.
	// Its name is from when retention was its only user; queued jobs name
	// it, so it stays.
	QueueTrims = "ff_retention"
)

// Queues are the fleet's queues, in the order `worker status` lists them.
var Queues = []string{QueueTicks, QueueControl, QueueRows, QueueTrims}

// DefaultRiverSchema is the Postgres schema of River's tables, where other
// services insert their jobs, unless the fleet is configured with another
// (--river-schema).
const DefaultRiverSchema = "river"

// UnfinishedStates is the uniqueness scope of scans and row jobs: a key is
// taken only while a job with it can still run. River's default also includes
// completed (kept for the retention period), which would silently drop a
// second, legitimate action on the same row after the first one finished.
// retryable is included so a row whose action keeps failing holds one job in
// backoff instead of gaining another one every tick.
var UnfinishedStates = []rivertype.JobState{
	rivertype.JobStateAvailable,
	rivertype.JobStatePending,
	rivertype.JobStateRunning,
	rivertype.JobStateRetryable,
	rivertype.JobStateScheduled,
}

// Attempts. A tick that fails is replaced by the next tick; a scan is cheap to
// retry; a row action that fails a few times (a lock timeout, a deadlock
// victim) is retried with backoff and, once discarded, picked up again by a
// later scan if the row is still due.
const (
	TickMaxAttempts = 1
	ScanMaxAttempts = 3
	RowMaxAttempts  = 5
)

// RiverSchedulerInterval is how often River's scheduler makes scheduled
// jobs available (River's fixed default; not configurable in v0.51). A job
// scheduled for a time therefore starts up to this much after it.
const RiverSchedulerInterval = 5 * time.Second

func scanOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueControl,
		MaxAttempts: ScanMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true, ByState: UnfinishedStates},
	}
}

func rowOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueRows,
		MaxAttempts: RowMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true, ByState: UnfinishedStates},
	}
}

// TickInsertOpts are the insert options of a reconciler's periodic tick.
// A reconciler has at most one unfinished tick: a tick that is due while
// the last one still waits or runs is skipped, so ticks slower than their
// interval (a loaded server) never pile up, and a new leader's first tick
// joins its predecessor's last instead of doubling it. A tick is idempotent
// (scans are unique per partition), so one that follows another closely
// costs a probe, nothing more.
func TickInsertOpts() *river.InsertOpts {
	return &river.InsertOpts{
		Queue:       QueueTicks,
		MaxAttempts: TickMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByState: UnfinishedStates},
	}
}
