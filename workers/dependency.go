package workers

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/internal/notifylisten"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// DependencyStaleThreshold is how long after its commit a completion event
// is left to FlowFabric's own dispatcher before dependency dispatches it
// (--dependency-stale-threshold): FlowFabric's supervisor's 15 s
// (DEFAULT_DEP_STALE_MS). Off, the fleet is the primary dispatcher: it
// takes every undispatched event, woken for each by FlowFabric's
// ff_completion notification.
var DependencyStaleThreshold = &Setting{
	Flag: "dependency-stale-threshold",
	Help: "dependency dispatches completion events undispatched this long after their commit, as FlowFabric's supervisor does " +
		"(0: at once, woken by FlowFabric's ff_completion notification: the fleet is the primary dispatcher; " +
		"turn FlowFabric's own completion listener off then, see docs/deployment.md)",
	Default:  15 * time.Second,
	CanBeOff: true,
	ShapeKey: "dependency_stale_threshold",
}

// Dependency dispatches completion events nobody dispatched: FlowFabric's
// dependency reconciler (every 15 s, events older than its 15 s stale
// threshold) with FlowFabric's cascade, claim and hops of an event in one
// transaction so that no hop is ever lost (see package store). The skipped
// events its hops write for impossible downstreams are dispatched at once, in
// the same commit, so a chain of skips drains in one pass instead of one hop
// per tick. Its tenant filter reads the event's own namespace and
// instance_tag columns, as FlowFabric's does. As the primary dispatcher
// (DependencyStaleThreshold off) it also listens to FlowFabric's
// ff_completion notification.
var Dependency = define[jobs.DependencyTickArgs, jobs.DependencyScanArgs](Reconciler{
	Name:     "dependency",
	Interval: 15 * time.Second,
	Due:      store.CompletionEvents,
	Settings: []*Setting{DependencyStaleThreshold},
	Behind:   tickBehind,
	Lanes:    true,
	Tables:   []string{"ff_completion_event", "ff_edge", "ff_edge_group", "ff_pending_cancel_groups", "ff_exec_core"},
	Listen:   listenForCompletions,
}, func(p int16, x store.DueRow) jobs.DependencyDispatchArgs {
	id, _ := strconv.ParseInt(x.ID, 10, 64) // the scan's event_id::text
	return jobs.DependencyDispatchArgs{Partition: p, EventID: id}
}, func(d *deps) river.Worker[jobs.DependencyDispatchArgs] {
	leaves := &leafCache{}
	return &dependencyWorker{d: d, dispatches: coalesce.New(coalesce.Config{
		MaxBatch: d.cfg.RowBatch, InFlight: DependencyTransactions, Timeout: RowTimeout,
	}, func(ctx context.Context, p int16, ids []int64) ([]store.CompletionResult, error) {
		// A single event (every event of a primary dispatcher's steady
		// stream) on its partition's lane, with plans cached there; a batch
		// plans its statements once for all its events, on Pool.
		if lanes := d.cfg.DispatchLanes; len(ids) == 1 && len(lanes) > 0 {
			if lv := leaves.get(ctx, d); lv != nil {
				return store.DispatchCompletionsOnLeaves(ctx, lanes[int(p)%len(lanes)], lv, p, ids, store.NowMs(), d.cfg.Filter, enqueueSkipEvents(p))
			}
		}
		return store.DispatchCompletions(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter, enqueueSkipEvents(p))
	})}
})

// leafCache holds the dispatch tables' leaves (store.LoadLeaves), read once.
// A failed read is logged and tried again a minute later; meanwhile
// dispatches run on the parents' statements.
type leafCache struct {
	mu       sync.Mutex
	leaves   *store.Leaves
	failedAt time.Time
}

func (c *leafCache) get(ctx context.Context, d *deps) *store.Leaves {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaves != nil || time.Since(c.failedAt) < time.Minute {
		return c.leaves
	}
	lv, err := store.LoadLeaves(ctx, d.cfg.Pool, store.DispatchTables...)
	if err != nil {
		c.failedAt = time.Now()
		d.log().Warn("dependency: single events dispatched on the parent tables' statements", "reconciler", "dependency", "error", err)
		return nil
	}
	c.leaves = lv
	return lv
}

// enqueueSkipEvents is the dispatch hook of partition p: the skipped events
// the hops wrote are dispatched by jobs inserted in the same transaction: a
// chain of skips drains now, and a crash between the write and the insert
// cannot happen.
func enqueueSkipEvents(p int16) store.BatchDispatchHook {
	return func(ctx context.Context, tx pgx.Tx, res []store.CompletionResult) error {
		var params []river.InsertManyParams
		for _, r := range res {
			for _, id := range r.SkipEvents() {
				params = append(params, river.InsertManyParams{Args: jobs.DependencyDispatchArgs{Partition: p, EventID: id}})
			}
		}
		if len(params) == 0 {
			return nil
		}
		if _, err := river.ClientFromContext[pgx.Tx](ctx).InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("enqueue dispatch of %d skipped events: %w", len(params), err)
		}
		return nil
	}
}

// staleThreshold is how long after its commit an event is due: the
// setting, or none when it is off.
func staleThreshold(v Values) time.Duration { return max(v.Get(DependencyStaleThreshold), 0) }

// PrimaryTickGrace is how long after its commit a completion event is the
// ticks' when the fleet is the primary dispatcher: before that it is the
// listener's, which dispatches it within ~0.1 s. Ticks taking every
// undispatched event raced the listener: each scanned every partition that
// held a fresh event and re-offered jobs already queued (170 scans and 144
// re-offers in 30 s at 1,000 events/s; none with the grace,
// docs/performance.md). An event whose notification was missed (a listener
// reconnecting) waits at most a tick interval and this.
const PrimaryTickGrace = 5 * time.Second

// tickBehind is how long after its commit an event is due for the ticks:
// the stale threshold, or PrimaryTickGrace when it is off.
func tickBehind(v Values) time.Duration {
	if !v.On(DependencyStaleThreshold) {
		return PrimaryTickGrace
	}
	return staleThreshold(v)
}

// completionChannel is FlowFabric's completion notification channel
// (ff_notify_completion_event): its payload is the event id.
const completionChannel = "ff_completion"

// listenForCompletions makes the fleet the primary dispatcher when the
// stale threshold is off: each event FlowFabric notifies is looked up and
// its dispatch job inserted at once, instead of at the next tick. Every
// process listens; their inserts of one event are unique among unfinished
// jobs, and a dispatch that finds the event claimed changes nothing. An
// event notified while a listener was down is the ticks' (which then take
// every undispatched event).
func listenForCompletions(env ListenEnv) (Runner, error) {
	if env.Settings.On(DependencyStaleThreshold) {
		return nil, nil
	}
	return notifylisten.New(notifylisten.Config{
		Pool: env.Pool, Channel: completionChannel, What: "completion notifications", Logger: env.Logger, Listening: env.Listening,
		Handle: func(ctx context.Context, conn *pgx.Conn, ids []int64) error {
			events, err := store.UndispatchedEvents(ctx, conn, ids, env.Filter)
			if err != nil || len(events) == 0 {
				return err
			}
			params := make([]river.InsertManyParams, len(events))
			for i, e := range events {
				params[i] = river.InsertManyParams{Args: jobs.DependencyDispatchArgs{Partition: e.Partition, EventID: e.EventID}}
			}
			return env.Insert(ctx, params)
		},
	})
}

// DependencyTransactions is the most dispatch transactions a process holds
// open at once, whatever --row-statements says. Events fanning into one hot
// group queue on its lock, each transaction holding a connection of the
// work pool while it waits; without a bound, River's row workers (hundreds)
// would take every connection and starve the other reconcilers'
// statements. Waiting for a transaction holds no connection.
const DependencyTransactions = 8

// dependencyWorker dispatches one completion event. Events of one partition
// asked for while a dispatch transaction is in flight share the next one
// (at most --row-batch, --row-statements transactions at once): one claim
// statement, one write statement and one commit for the batch instead of
// about seven round trips per event (store.DispatchCompletions). A batch
// that fails is run again event by event (internal/coalesce), so one bad
// event fails only its own job, and no hop is applied twice: a failed
// batch rolled back every claim and hop it held.
type dependencyWorker struct {
	rowDefaults[jobs.DependencyDispatchArgs]
	d          *deps
	dispatches *coalesce.Coalescer[int16, int64, store.CompletionResult]
}

func (w *dependencyWorker) Work(ctx context.Context, job *river.Job[jobs.DependencyDispatchArgs]) error {
	a := job.Args
	c := w.d.stats(Dependency)
	res, err := w.dispatches.Do(ctx, a.Partition, a.EventID)
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
	w.d.cfg.Observer.Lateness(Dependency.Name, time.Since(time.UnixMilli(res.CommittedAtMs+staleThreshold(w.d.cfg.Settings).Milliseconds())))
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
