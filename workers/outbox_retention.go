package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// OutboxRetentionName names the outbox trim in stats, metrics and logs. It
// is not a Reconciler: it has no partitions to fan out over (both outboxes
// are walked in event-id order), so its periodic job trims by itself.
const OutboxRetentionName = "outbox_retention"

// OutboxRetentionInterval is the outbox trim's default interval.
const OutboxRetentionInterval = time.Minute

// ErrOutboxTrimFiltered is why a fleet with a tenant filter never trims the
// outboxes: they are shared by every tenant, trimmed oldest first by
// event_id so that what is left is always their newest part, and lease
// history's trim mark (store.OutboxTrimmedThrough) is one for all; a
// per-tenant trim would delete events in the middle of the outbox, under a
// mark that no longer says what is gone. The outboxes are trimmed by one
// fleet without a filter, for every tenant, at the longest retention any
// of them needs.
var ErrOutboxTrimFiltered = errors.New("the lease and completion outboxes are shared by every tenant and trimmed oldest first by event id, " +
	"under one trim mark for lease history, so a tenant's fleet would delete the other tenants' events; " +
	"run --outbox-retention in one fleet without --namespace and --instance-tag, in a River schema of its own " +
	"(e.g. worker run --river-schema river_shared --reconcilers budget_reset,worker_registry_ttl --outbox-retention 168h), " +
	"with the longest retention any tenant needs")

// outboxTrimBudget is how long one outbox trim deletes batches; what is
// left waits for the next tick, so a first run over months of events
// spreads over several ticks instead of one long job.
const outboxTrimBudget = 10 * time.Second

// outboxTrimWorker trims both outboxes (see store.TrimLeaseEvents and
// store.TrimCompletionEvents), batch by batch, until neither has anything
// older than Config.OutboxRetention or its budget is spent.
type outboxTrimWorker struct {
	river.WorkerDefaults[jobs.OutboxTrimArgs]
	d *deps
}

// Timeout implements river.Worker.
func (w *outboxTrimWorker) Timeout(*river.Job[jobs.OutboxTrimArgs]) time.Duration { return ScanTimeout }

// Work implements river.Worker.
func (w *outboxTrimWorker) Work(ctx context.Context, job *river.Job[jobs.OutboxTrimArgs]) error {
	d := w.d
	c := d.cfg.Stats.For(OutboxRetentionName)
	c.Ticks.Add(1)
	if !d.cfg.Filter.Empty() {
		// Enqueued by someone else (this fleet's config refuses a trim
		// with a filter): cancelled with the reason, never retried.
		c.Skipped.Add(1)
		d.log().Warn("outbox trim refused: this fleet has a tenant filter; job cancelled", "job_id", job.ID, "filter", d.cfg.Filter.String())
		return river.JobCancel(fmt.Errorf("outbox trim in a fleet with a tenant filter (%s): %w", d.cfg.Filter, ErrOutboxTrimFiltered))
	}
	if d.cfg.OutboxRetention <= 0 {
		d.log().Warn("outbox trim skipped: this process runs without --outbox-retention", "job_id", job.ID)
		return nil
	}
	start := time.Now()
	type outbox struct {
		name string
		trim func(ctx context.Context, db store.DB, cutoffMs int64, limit int) (store.OutboxTrimResult, error)
		done bool
		n    int
	}
	boxes := []*outbox{{name: store.OutboxLeaseEvents, trim: store.TrimLeaseEvents}, {name: "ff_completion_event", trim: store.TrimCompletionEvents}}
	for time.Since(start) < outboxTrimBudget {
		progress := false
		for _, b := range boxes {
			if b.done {
				continue
			}
			cutoff := store.NowMs() - d.cfg.OutboxRetention.Milliseconds()
			res, err := b.trim(ctx, d.cfg.Pool, cutoff, d.cfg.OutboxBatchSize)
			if err != nil {
				c.Errors.Add(1)
				if errors.Is(err, store.ErrOutboxTrimTableMissing) {
					return river.JobCancel(err)
				}
				return err
			}
			c.Applied.Add(int64(res.Deleted))
			if res.Deleted > 0 {
				d.cfg.Observer.Lateness(OutboxRetentionName, time.Duration(cutoff-res.OldestMs)*time.Millisecond)
			}
			b.n += res.Deleted
			b.done = res.Deleted < d.cfg.OutboxBatchSize
			progress = progress || !b.done
		}
		if !progress {
			break
		}
	}
	if boxes[0].n+boxes[1].n > 0 {
		d.log().Info("trimmed outboxes", "lease_events", boxes[0].n, "completion_events", boxes[1].n,
			"more_left", !boxes[0].done || !boxes[1].done, "elapsed", time.Since(start).Round(time.Millisecond))
	}
	return nil
}
