package workers

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Dependency dispatches completion events nobody dispatched: FlowFabric's
// dependency reconciler (every 15 s, events older than its 15 s stale
// threshold) with FlowFabric's cascade, claim and hops of an event in one
// transaction so that no hop is ever lost (see package store). The skipped
// events its hops write for impossible downstreams are dispatched at once, in
// the same commit, so a chain of skips drains in one pass instead of one hop
// per tick. Its tenant filter reads the event's own namespace and
// instance_tag columns, as FlowFabric's does.
var Dependency = define[jobs.DependencyTickArgs, jobs.DependencyScanArgs](Reconciler{
	Name:     "dependency",
	Interval: 15 * time.Second,
	Due:      store.CompletionEvents,
	Behind:   func(c Config) time.Duration { return max(c.DependencyStaleThreshold, 0) },
	Tables:   []string{"ff_completion_event", "ff_edge", "ff_edge_group", "ff_pending_cancel_groups", "ff_exec_core"},
}, func(p int16, x store.DueRow) jobs.DependencyDispatchArgs {
	id, _ := strconv.ParseInt(x.ID, 10, 64) // the scan's event_id::text
	return jobs.DependencyDispatchArgs{Partition: p, EventID: id}
}, func(d *deps) river.Worker[jobs.DependencyDispatchArgs] {
	return &dependencyWorker{d: d, slots: make(chan struct{}, DependencyTransactions)}
})

// DependencyTransactions is the most dispatch transactions a process holds
// open at once. Events fanning into one hot group queue on its lock, each
// holding a connection of the work pool while it waits; without a bound,
// River's row workers (hundreds) would take every connection and starve the
// other reconcilers' statements. Waiting for a slot holds no connection.
const DependencyTransactions = 8

// dependencyWorker dispatches one completion event.
type dependencyWorker struct {
	rowDefaults[jobs.DependencyDispatchArgs]
	d     *deps
	slots chan struct{}
}

func (w *dependencyWorker) Work(ctx context.Context, job *river.Job[jobs.DependencyDispatchArgs]) error {
	a := job.Args
	c := w.d.stats(Dependency)
	client := river.ClientFromContext[pgx.Tx](ctx)
	// The skipped events the hops wrote are dispatched by jobs inserted in
	// the same transaction: a chain of skips drains now, and a crash
	// between the write and the insert cannot happen.
	hook := func(ctx context.Context, tx pgx.Tx, res store.CompletionResult) error {
		ids := res.SkipEvents()
		if len(ids) == 0 {
			return nil
		}
		params := make([]river.InsertManyParams, len(ids))
		for i, id := range ids {
			params[i] = river.InsertManyParams{Args: jobs.DependencyDispatchArgs{Partition: a.Partition, EventID: id}}
		}
		if _, err := client.InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("enqueue dispatch of %d skipped events: %w", len(ids), err)
		}
		return nil
	}
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	res, err := store.DispatchCompletion(ctx, w.d.cfg.Pool, a.Partition, a.EventID, store.NowMs(), w.d.cfg.Filter, hook)
	<-w.slots
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", Dependency.Name, "partition", a.Partition, "event_id", a.EventID, "job_id", job.ID)
	switch res.Outcome {
	case store.CompletionOutsideTenant:
		return w.d.outsideTenant(Dependency, a.Partition, log)
	case store.CompletionAlreadyDispatched:
		c.NoOp(NoOpNoLongerDue)
		log.Debug("completion event already dispatched or gone; nothing to do")
		jobLog(ctx).Info("completion event already dispatched or gone")
		return nil
	}
	if len(res.SkipEvents()) > 0 {
		// River notifies an insert at most once per fetch cooldown per
		// queue, so every other hop of a chain would wait for the next
		// poll (a second): wake the row queue's producers now that the
		// jobs are committed.
		w.d.wake(time.Now())
	}
	c.Applied.Add(1)
	w.d.cfg.Observer.Lateness(Dependency.Name, time.Since(time.UnixMilli(res.CommittedAtMs+Dependency.Behind(w.d.cfg).Milliseconds())))
	log = log.With("execution_id", res.ExecutionID, "flow_id", res.FlowID, "outcome", res.EventOutcome)
	if res.UnknownOutcome {
		log.Warn("completion event's outcome is none FlowFabric writes; counted as a failure, as FlowFabric does")
	}
	decisions := make([]string, 0, len(res.Hops))
	for _, h := range res.Hops {
		hl := log.With("downstream_eid", h.DownstreamEID)
		switch {
		case h.GroupMissing:
			c.Skipped.Add(1)
			hl.Warn("edge without an ff_edge_group row for its downstream; edge counted as advanced, nothing changed, as FlowFabric does")
			decisions = append(decisions, "no_group")
			continue
		case h.DownstreamMissing:
			hl.Warn("edge group decided, but its downstream has no ff_exec_core row; counters written, nothing else", "decision", h.Decision.String())
		}
		if h.OddPolicy {
			hl.Warn("edge group's policy is not one FlowFabric writes (not an object, or an unknown kind); read as all_of, as FlowFabric does")
		}
		decisions = append(decisions, h.Decision.String())
	}
	jobLog(ctx).Info("completion event dispatched", "execution_id", res.ExecutionID, "outcome", res.EventOutcome, "edges", len(res.Hops), "decisions", decisions,
		"skip_events", res.SkipEvents())
	log.Debug("completion event dispatched", "edges", len(res.Hops), "decisions", decisions)
	return nil
}
