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

// OutboxAge is how old lease events, and dispatched completion events, are
// when outbox retention deletes them (--outbox-retention): off unless set,
// and outbox retention runs only with it.
var OutboxAge = &Setting{
	Flag: "outbox-retention",
	Help: "delete lease events, and dispatched completion events, older than this, e.g. 168h, every tenant's alike: " +
		"refused with --namespace or --instance-tag",
	Default:  Off,
	CanBeOff: true,
	Min:      time.Second,
	ShapeKey: "outbox_retention",
}

// OutboxRetention deletes lease events and dispatched completion events
// older than OutboxAge, oldest first, whatever their execution's state. Its
// periodic job trims by itself (defineSingle): both outboxes are walked in
// event-id order across partitions, so there is nothing to fan out over.
var OutboxRetention = defineSingle[jobs.OutboxTrimArgs](Reconciler{
	Name:          "outbox_retention",
	Interval:      time.Minute,
	Settings:      []*Setting{OutboxAge},
	OnlyWith:      OutboxAge,
	RefusesFilter: ErrOutboxTrimFiltered,
	Tables:        []string{"ff_lease_event", "ff_completion_event", store.OutboxTrimTable},
}, func(r *Reconciler, d *deps) river.Worker[jobs.OutboxTrimArgs] { return &outboxTrimWorker{r: r, d: d} })

// ErrOutboxTrimFiltered is why a fleet with a tenant filter never trims the
// outboxes: they are shared by every tenant, trimmed oldest first by
// event_id so that what is left is always their newest part, and lease
// history's trim mark (store.LeaseEventsTrimmedThrough) is one for all; a
// per-tenant trim would delete events in the middle of the outbox, under a
// mark that no longer says what is gone. The outboxes are trimmed by one
// fleet without a filter, for every tenant, at the longest retention any
// of them needs.
var ErrOutboxTrimFiltered = errors.New("the lease and completion outboxes are shared by every tenant and trimmed oldest first by event id, " +
	"under one trim mark for lease history, so a tenant's fleet would delete the other tenants' events; " +
	"run --outbox-retention in one fleet without --namespace and --instance-tag, in a River schema of its own " +
	"(e.g. worker run --river-schema river_shared --reconcilers budget_reset,worker_registry_ttl --outbox-retention 168h), " +
	"with the longest retention any tenant needs")

// outboxBatch is the most events one outbox trim statement deletes.
const outboxBatch = 10_000

// outboxTrimBudget is how long one outbox trim deletes batches; what is
// left waits for the next tick, so a first run over months of events
// spreads over several ticks instead of one long job.
const outboxTrimBudget = 10 * time.Second

// outboxTrimWorker trims both outboxes (see store.TrimLeaseEvents and
// store.TrimCompletionEvents), batch by batch, until neither has anything
// older than Config.OutboxRetention or its budget is spent.
type outboxTrimWorker struct {
	river.WorkerDefaults[jobs.OutboxTrimArgs]
	r *Reconciler
	d *deps
}

// Timeout implements river.Worker.
func (w *outboxTrimWorker) Timeout(*river.Job[jobs.OutboxTrimArgs]) time.Duration { return ScanTimeout }

// Work implements river.Worker.
func (w *outboxTrimWorker) Work(ctx context.Context, job *river.Job[jobs.OutboxTrimArgs]) error {
	d, r := w.d, w.r
	c := d.stats(r)
	c.Ticks.Add(1)
	if !d.cfg.Filter.Empty() {
		// Enqueued by someone else (this fleet's config refuses a trim
		// with a filter): cancelled with the reason, never retried.
		c.Skipped.Add(1)
		d.log().Warn("outbox trim refused: this fleet has a tenant filter; job cancelled", "job_id", job.ID, "filter", d.cfg.Filter.String())
		return river.JobCancel(fmt.Errorf("outbox trim in a fleet with a tenant filter (%s): %w", d.cfg.Filter, ErrOutboxTrimFiltered))
	}
	if !d.cfg.Settings.On(OutboxAge) {
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
	boxes := []*outbox{{name: "ff_lease_event", trim: store.TrimLeaseEvents}, {name: "ff_completion_event", trim: store.TrimCompletionEvents}}
	for time.Since(start) < outboxTrimBudget {
		progress := false
		for _, b := range boxes {
			if b.done {
				continue
			}
			cutoff := store.NowMs() - d.cfg.Settings.Get(OutboxAge).Milliseconds()
			res, err := b.trim(ctx, d.cfg.Pool, cutoff, outboxBatch)
			if err != nil {
				c.Errors.Add(1)
				if errors.Is(err, store.ErrOutboxTrimTableMissing) {
					return river.JobCancel(err)
				}
				return err
			}
			c.Applied.Add(int64(res.Deleted))
			if res.Deleted > 0 {
				d.cfg.Observer.Lateness(r.Name, time.Duration(cutoff-res.OldestMs)*time.Millisecond)
			}
			b.n += res.Deleted
			b.done = res.Deleted < outboxBatch
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
