// Package fleet assembles one worker process of the fleet: its three
// database pools (River's, the work pool and the tick pool), the River
// client with the fleet's queues, workers, hooks and periodic ticks.
// cmd/worker runs it; tests run several against one database.
package fleet

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fetchwake"
	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/internal/metrics"
	"github.com/flowfabric/ffreconcile/internal/takeover"
	"github.com/flowfabric/ffreconcile/internal/tracing"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/periodic"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// Config configures one process. Zero values take the defaults below
// (WithDefaults).
type Config struct {
	// DatabaseURL is the server and database, URL or key=value. Defaults to
	// dbconn.DefaultURL.
	DatabaseURL string
	// RiverSchema is the schema of River's tables. Defaults to
	// jobs.DefaultRiverSchema.
	RiverSchema string

	// Reconcilers maps each enabled reconciler, by name, to its tick
	// interval (zero: its own default interval). Defaults to every
	// reconciler a fleet with these Settings runs (workers.DefaultOn): all
	// but those turned on by a setting left off.
	Reconcilers map[string]time.Duration
	// Settings are the reconcilers' own settings (each reconciler's
	// Settings, e.g. workers.RetentionAge): absent or zero takes the
	// default, workers.Off turns off one that can be.
	Settings workers.Values
	// Listening, when set, is called each time a reconciler's listener
	// (dependency's, as the primary dispatcher) starts listening: a test
	// signal, since notifications before it reach nobody.
	Listening func()
	// InsertNotifyCooldown, when set, is the least time between two insert
	// notifications this process's River client sends for one queue
	// (River's Config.FetchCooldown); otherwise it is RowFetchCooldown. A
	// test sets it long to hold River's own announcements back, so that
	// only the fleet's wakers can start a job early, instead of waiting out
	// a cooldown.
	InsertNotifyCooldown time.Duration

	// Filter limits the fleet to one tenant. Defaults to none.
	Filter store.Filter
	// BatchSize is the most rows one partition scan enqueues. Defaults to
	// workers.DefaultBatchSize.
	BatchSize int
	// PartitionCount is the number of flow partitions scanned. Defaults to
	// jobs.PartitionCount.
	PartitionCount int
	// BudgetPartitionCount is the number of budget partitions the budget
	// reset walks, FlowFabric's num_budget_partitions. Defaults to
	// workers.DefaultBudgetPartitionCount.
	BudgetPartitionCount int

	// RowWorkers is the number of row jobs River runs at once. Row jobs
	// mostly wait for their row's statement (RowBatch, RowStatements), so
	// many of them cost little and let each fetch take a large batch: River
	// fetches at most RowWorkers minus the jobs still running, and the rows
	// queue drains at about RowWorkers divided by how long a job waits for
	// its statement (docs/performance.md). Defaults to DefaultRowWorkers.
	RowWorkers int
	// WorkConns is the size of the work pool, the connections row
	// statements, scans and ticks share. What bounds the load row actions
	// put on Postgres is RowStatements, not this. Defaults to
	// DefaultWorkConns.
	WorkConns int
	// DispatchLanes is how many one-connection pools run the dependency
	// reconciler's single-event dispatches (Fleet.DispatchLanes); -1 for
	// none (--dispatch-lanes 0). Defaults to DefaultDispatchLanes.
	DispatchLanes int
	// RowBatch is the most row actions of one partition that share one
	// statement (1 turns sharing off). Defaults to workers.DefaultRowBatch.
	RowBatch int
	// RowStatements is the most row-action statements of one reconciler in
	// flight. Two when commits wait for the WAL flush, so one statement
	// runs while the other's commit waits; one when they do not, since a
	// second statement then only splits the rows queued meanwhile into two
	// smaller batches, each planned and committed (docs/performance.md).
	// Defaults to workers.DefaultRowStatements, or 1 when SynchronousCommit
	// is "off".
	RowStatements int
	// Lookahead: the reconcilers that look ahead enqueue rows falling due
	// before their next tick plus this margin at once, as row jobs that
	// start at the row's deadline; about how long a tick's burst of
	// partition scans takes, so a row due just after the next tick is still
	// found by it. Negative: only rows already due. A reconciler's whole
	// window, its tick interval plus this, is capped at
	// jobs.RiverSchedulerInterval. See workers.Config.Lookahead. Defaults
	// to DefaultLookahead.
	Lookahead time.Duration
	// SynchronousCommit is the work pool's synchronous_commit. "off" lets
	// row actions commit without waiting for the WAL flush; see
	// docs/design.md for what a server crash can then cost. Defaults to
	// "on".
	SynchronousCommit string
	// RiverSynchronousCommit is the synchronous_commit of River's own pool
	// (fetches, completions, leadership, periodic inserts). A job state
	// lost in a Postgres crash only means a job runs again, and every
	// action re-checks its row, so River's bookkeeping need not wait for
	// the WAL flush; waiting made it compete with the outboxes' serialised
	// notifying commits. Defaults to "off".
	RiverSynchronousCommit string
	// RowFetchCooldown is the least time between two fetches of row jobs.
	// River's default of 100 ms caps a process at RowWorkers per 100 ms;
	// much shorter makes many small fetches, each an index scan of
	// river_job (docs/performance.md). Defaults to DefaultRowFetchCooldown.
	RowFetchCooldown time.Duration
	// FetchPollInterval is how often idle queues poll for jobs that no
	// notification announced; the ticks', scans' and retention queues poll
	// every 5 s at most unless PollOnly (notifiedPollInterval). Defaults to
	// DefaultFetchPollInterval.
	FetchPollInterval time.Duration
	// CompletedJobRetention is how long completed jobs stay visible in
	// River UI: row jobs are numerous, and River's 24 h default would grow
	// river_job by every row ever reconciled. Defaults to
	// DefaultCompletedJobRetention.
	CompletedJobRetention time.Duration
	// ReindexInterval is how often River's reindexer rebuilds river_job's
	// indexes (REINDEX CONCURRENTLY, on the leader). Row jobs' args carry
	// values no other job has, and a GIN index keeps an entry for every
	// value it ever held, so river_job_args_index grows with the jobs
	// inserted until rebuilt (docs/performance.md, "The soak: what
	// grows"). Zero keeps River's default: daily at midnight UTC.
	ReindexInterval time.Duration
	// RescueStuckJobsAfter: a job left running by a killed process is
	// retried after this, above the longest job timeout; River's rescuer
	// runs every 30 s, so such a row is acted on within a minute instead of
	// River's default hour. Defaults to DefaultRescueStuckJobsAfter.
	RescueStuckJobsAfter time.Duration

	// ClientID names this process in River (leader, heartbeats). Defaults
	// to one River derives from the host name.
	ClientID string
	// PollOnly disables LISTEN/NOTIFY (for transaction-mode poolers).
	PollOnly bool
	// Observer, when set, receives every lateness measurement as the
	// metrics do (the benchmark's soak keeps them per window). Defaults to
	// none.
	Observer workers.Observer
	// ExtraWorkers, when set, adds workers of other kinds to the fleet's
	// River client, worked with the fleet's queues and settings: the
	// benchmark's no-op jobs measure River's own ceiling with it. Defaults
	// to none.
	ExtraWorkers func(*river.Workers) error
	// QueryTracer, when set, sees every statement of the pools (the
	// benchmark counts statements with it). It replaces the OpenTelemetry
	// SQL tracer.
	QueryTracer pgx.QueryTracer
	// Tracing adds OpenTelemetry spans for River jobs and SQL statements to
	// the global tracer provider (see internal/tracing).
	Tracing bool
	// DisableJobLogs turns off the per-job logs River UI shows (riverlog):
	// each row job then stores nothing in its metadata.
	DisableJobLogs bool
	// DisableTakeover: this process does not take over from a process of
	// the fleet that died without a clean stop (none of its connections
	// left; see internal/takeover); its leadership and running jobs are
	// then left to River's leadership TTL and rescuer. Nor does it start
	// the ticks when a leadership changes hands (handoff): River's new
	// leader starts them 0-6 s after its election. With PollOnly the
	// process's connections carry no tag, so others never judge it by
	// them, and it judges no one.
	DisableTakeover bool
	// MetricsReadTimeout bounds each of a scrape's reads of the database
	// (metrics.Config.ReadTimeout; 0: its default, 3 s). Tests that check
	// the values read, on a loaded machine, give it longer.
	MetricsReadTimeout time.Duration

	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultRowWorkers            = 256
	DefaultWorkConns             = 24
	DefaultDispatchLanes         = 8 // the dependency reconciler's transactions in flight
	DefaultRowFetchCooldown      = 20 * time.Millisecond
	DefaultFetchPollInterval     = time.Second
	DefaultCompletedJobRetention = 10 * time.Minute
	DefaultRescueStuckJobsAfter  = 25 * time.Second
	DefaultLookahead             = 500 * time.Millisecond
	controlWorkers               = 8
)

// Fleet is one assembled process.
type Fleet struct {
	Config    Config
	RiverPool *pgxpool.Pool // River's own queries: fetch, complete, leadership
	WorkPool  *pgxpool.Pool // the reconcilers' SQL
	TickPool  *pgxpool.Pool // the ticks' whole-table queries, with cached generic plans
	// DispatchLanes are the dependency reconciler's single-event dispatch
	// connections (workers.Config.DispatchLanes), one pool of one
	// connection each; none when no reconciler run wants them
	// (workers.Reconciler.Lanes).
	DispatchLanes []*pgxpool.Pool
	Client        *river.Client[pgx.Tx]
	Workers       *workers.Set
	Metrics       *metrics.Metrics
	// ConnTag is the tag every connection of the process carries at the
	// end of its application_name (store.ConnTagged), recorded with its
	// heartbeat; empty with PollOnly.
	ConnTag string
	// Taker takes over from dead processes of the fleet; nil with
	// DisableTakeover.
	Taker *takeover.Taker
	// Waker wakes the row queue's producers when row jobs enqueued ahead
	// fall due and when a scan inserted row jobs already due; nil with
	// PollOnly (no notification reaches River then).
	Waker *fetchwake.Waker
	// ScanWaker announces the scans a tick or a scan inserts into
	// jobs.QueueControl (workers.Config.WakeScans); nil with PollOnly.
	ScanWaker *fetchwake.Waker
	// listeners are what the reconcilers run beside their jobs
	// (Reconciler.Listen).
	listeners []workers.Runner

	// handoff starts the ticks at once when this process ends a River
	// leadership: a dead leader's (takeover) or its own (Stop); nil with
	// DisableTakeover.
	handoff *handoff

	stopWaker func() // stops the wakers' goroutines and waits for them
	// stopListeners stops the listeners and waits for them.
	stopListeners func()
	// stopBeat stops the heartbeat's goroutine, which deletes the
	// process's row, and waits for it.
	stopBeat func()
}

// WithDefaults returns a copy of c with every unset field at its default
// (Settings), every enabled reconciler at its interval.
func (c Config) WithDefaults() Config {
	if c.Reconcilers == nil {
		c.Reconcilers = map[string]time.Duration{}
		for _, r := range workers.DefaultOn(c.Settings) {
			c.Reconcilers[r.Name] = 0
		}
	} else {
		c.Reconcilers = maps.Clone(c.Reconcilers)
	}
	for name, interval := range c.Reconcilers {
		if r, ok := workers.ByName(name); ok && interval == 0 {
			c.Reconcilers[name] = r.Interval
		}
	}
	c.Settings = maps.Clone(c.Settings)
	for _, s := range c.Flags() {
		if s.setDefault != nil {
			s.setDefault()
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first unusable setting of c with its defaults, in
// words a user can act on, naming its flag (ConfigError); New does the
// same. cmd/worker calls it to refuse bad flags before it connects.
func (c Config) Validate() error { return c.WithDefaults().validate() }

// validate checks a config whose defaults are applied: each setting, then
// the reconcilers run.
func (c Config) validate() error {
	for _, s := range c.Flags() {
		if d, ok := s.Value.(*time.Duration); ok && *d < 0 && (*d != workers.Off || !s.CanBeOff) {
			problem := "negative"
			if s.CanBeOff {
				problem = "negative (workers.Off, -1, turns it off)"
			}
			return &ConfigError{Flag: s.Flag, Field: s.Field, Value: d.String(), Problem: problem}
		}
		if s.problem == nil {
			continue
		}
		if p := s.problem(); p != "" {
			return &ConfigError{Flag: s.Flag, Field: s.Field, Value: s.shown(), Problem: p}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Reconcilers)) {
		r, ok := workers.ByName(name)
		if !ok {
			return &ConfigError{Flag: "reconcilers", Field: "Reconcilers", Value: name,
				Problem: fmt.Sprintf("unknown reconciler %q (known: %s)", name, strings.Join(workers.Names(), ", "))}
		}
		if interval := c.Reconcilers[name]; interval < periodic.MinInterval {
			return &ConfigError{Flag: r.IntervalFlag(), Field: "Reconcilers[" + name + "]", Value: interval.String(),
				Problem: fmt.Sprintf("interval too short (minimum %s)", periodic.MinInterval)}
		}
		if !r.On(c.Settings) {
			return &ConfigError{Flag: "reconcilers", Field: "Reconcilers", Value: name,
				Problem: fmt.Sprintf("runs only with --%s (%s)", r.OnlyWith.Flag, r.OnlyWith.Help)}
		}
		if r.RefusesFilter != nil && !c.Filter.Empty() {
			flag, field, value := "reconcilers", "Reconcilers", name
			if r.OnlyWith != nil {
				flag, field, value = r.OnlyWith.Flag, "Settings["+r.OnlyWith.Flag+"]", c.Settings.Get(r.OnlyWith).String()
			}
			return &ConfigError{Flag: flag, Field: field, Value: value,
				Problem: fmt.Sprintf("cannot run in a fleet with a tenant filter (%s): %s", c.Filter, r.RefusesFilter)}
		}
	}
	return nil
}

// running returns the enabled reconcilers, in the registry's order.
func (c Config) running() []*workers.Reconciler {
	var out []*workers.Reconciler
	for _, r := range workers.All() {
		if _, ok := c.Reconcilers[r.Name]; ok {
			out = append(out, r)
		}
	}
	return out
}

// tables returns the FlowFabric tables the enabled reconcilers touch and
// the objects of ours they need.
func (c Config) tables() []string {
	var out []string
	add := func(names []string) {
		for _, t := range names {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	for _, r := range c.running() {
		add(r.Tables)
	}
	for _, r := range workers.All() {
		add(r.AlwaysNeeds)
	}
	return out
}

// ticks returns the periodic jobs of the enabled reconcilers, in the
// registry's order.
func (c Config) ticks() []periodic.Tick {
	var out []periodic.Tick
	for _, r := range c.running() {
		out = append(out, periodic.Tick{Args: r.TickArgs(), Interval: c.Reconcilers[r.Name], InsertOpts: r.TickInsertOpts()})
	}
	return out
}

// New opens the pools, checks the ff_* schema and builds the River client.
// It does not start it.
func New(ctx context.Context, cfg Config) (*Fleet, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	periodicJobs, err := periodic.Jobs(cfg.ticks())
	if err != nil {
		return nil, err
	}
	// Behind a transaction-mode pooler (PollOnly) a server connection
	// serves any client and need not show this one's application_name:
	// no tag, so nobody judges this process by its connections.
	var tag string
	if !cfg.PollOnly {
		if tag, err = newConnTag(); err != nil {
			return nil, err
		}
	}

	// River's pool serves the producers' fetches, the batch completer,
	// leader election and the notifier's LISTEN connection.
	tracer := cfg.QueryTracer
	if tracer == nil && cfg.Tracing {
		tracer = tracing.QueryTracer()
	}
	riverPool, err := dbconn.Open(ctx, cfg.DatabaseURL, dbconn.Options{MaxConns: 10, AppName: store.ConnTagged("ffreconcile-river", tag), Tracer: tracer,
		RuntimeParams: map[string]string{
			"synchronous_commit": cfg.RiverSynchronousCommit,
			// A generic plan of River's fetch, cached while river_job was
			// small, seq-scans and sorts the whole table at every fetch once
			// a burst has grown it, until autovacuum's next ANALYZE. A
			// custom plan sees the table's current size
			// (docs/performance.md).
			"plan_cache_mode": "force_custom_plan",
		}})
	if err != nil {
		return nil, err
	}
	// The work pool bounds concurrent row actions and scans (WorkConns);
	// row workers beyond it wait for a connection.
	workPool, err := dbconn.Open(ctx, cfg.DatabaseURL, dbconn.Options{
		MaxConns: int32(cfg.WorkConns), AppName: store.ConnTagged("ffreconcile-work", tag), Tracer: tracer,
		RuntimeParams: map[string]string{
			// pgx prepares every statement, and after five runs Postgres
			// may switch it to a generic plan. On Postgres 15 a generic plan
			// over a partitioned table locks all 256 children and their
			// indexes at every execution: a few dozen concurrent row actions
			// then exhaust the lock table ("out of shared memory"). Custom
			// plans prune at plan time to the one child a row lives in.
			"plan_cache_mode":    "force_custom_plan",
			"synchronous_commit": cfg.SynchronousCommit,
			// Every statement on this pool reaches its rows through an
			// index: a batch's keys, or a deadline range. In a partition of
			// a few hundred rows Postgres's cost model prefers reading the
			// whole partition to a batch's key probes, which makes a row
			// statement cost O(partition) instead of O(batch). Off only
			// prices sequential scans out where an index path exists
			// (docs/performance.md, "Tick plans, and row statements that
			// read whole partitions").
			"enable_seqscan": "off",
		},
	})
	if err != nil {
		riverPool.Close()
		return nil, err
	}
	// Ticks run one at a time on the leader: two connections suffice.
	tickPool, err := dbconn.Open(ctx, cfg.DatabaseURL, dbconn.Options{
		MaxConns: 2, AppName: store.ConnTagged("ffreconcile-tick", tag), Tracer: tracer,
		// A tick that times out while planning keeps its connection and
		// what the backend cached of the partitions, so the next tick
		// goes on from there (see dbconn.Options.CancelOnServer).
		CancelOnServer: true,
		RuntimeParams: map[string]string{
			// JIT is off, as on every pool dbconn.Open makes: compiling a
			// generic plan over 256 partitions took 1.2 s per run
			// (docs/performance.md).
			"plan_cache_mode": "force_generic_plan",
		},
	})
	if err != nil {
		riverPool.Close()
		workPool.Close()
		return nil, err
	}
	f := &Fleet{Config: cfg, RiverPool: riverPool, WorkPool: workPool, TickPool: tickPool, ConnTag: tag}
	if slices.ContainsFunc(cfg.running(), func(r *workers.Reconciler) bool { return r.Lanes }) && cfg.DispatchLanes > 0 {
		// One connection per lane, so that each caches the generic plans
		// of its share of the partitions only: 256/8 partitions × the ~3
		// statements of an event × 30-60 KB each, about 5 MB a lane,
		// where every work connection caching every partition's would
		// hold ~45 MB (docs/performance.md).
		for range cfg.DispatchLanes {
			lane, err := dbconn.Open(ctx, cfg.DatabaseURL, dbconn.Options{
				MaxConns: 1, AppName: store.ConnTagged("ffreconcile-work-dispatch", tag), Tracer: tracer, Lazy: true,
				RuntimeParams: map[string]string{
					// Every statement on a lane names leaf partitions
					// (store.DispatchCompletionsOnLeaves), or River's
					// unpartitioned river_job for the skip events' jobs.
					"plan_cache_mode":    "force_generic_plan",
					"synchronous_commit": cfg.SynchronousCommit,
					"enable_seqscan":     "off",
				},
			})
			if err != nil {
				f.Close()
				return nil, err
			}
			f.DispatchLanes = append(f.DispatchLanes, lane)
		}
	}
	if err := f.build(ctx, periodicJobs); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (f *Fleet) build(ctx context.Context, periodicJobs []*river.PeriodicJob) error {
	cfg := f.Config
	if err := store.CheckRiverSchema(ctx, f.RiverPool, cfg.RiverSchema); err != nil {
		return err
	}
	if err := migrations.Check(ctx, f.WorkPool, cfg.RiverSchema, cfg.tables()...); err != nil {
		return err
	}
	checkServer(ctx, f.WorkPool, cfg.Logger)
	stats := workers.NewStats()
	f.Metrics = metrics.New(metrics.Config{
		Stats: stats, Pool: f.WorkPool, RiverSchema: cfg.RiverSchema, Filter: cfg.Filter, Logger: cfg.Logger,
		Settings: cfg.Settings, PartitionCount: cfg.PartitionCount, BudgetPartitionCount: cfg.BudgetPartitionCount,
		Intervals: cfg.Reconcilers, ReadTimeout: cfg.MetricsReadTimeout,
		// Read at scrape time: the client is built below.
		ClientID: func() string {
			if f.Client == nil {
				return ""
			}
			return f.Client.ID()
		},
		Pools: f.pools(),
	})
	var wake, wakeScans func(time.Time)
	if !cfg.PollOnly {
		// A waker of queue in granules of its fetch cooldown (River fetches
		// no more often), with its notifications counted as name.
		newWaker := func(queue string, granularity time.Duration, name, help string) (*fetchwake.Waker, error) {
			w, err := fetchwake.New(fetchwake.Config{
				DB: f.RiverPool, Schema: cfg.RiverSchema, Queue: queue, Granularity: granularity, Logger: cfg.Logger,
			})
			if err != nil {
				return nil, err
			}
			f.Metrics.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "ffreconcile", Name: name, Help: help,
			}, func() float64 { return float64(w.Sent()) }))
			return w, nil
		}
		w, err := newWaker(jobs.QueueRows, cfg.RowFetchCooldown, "fetch_wakeups_total",
			"Notifications sent to start row jobs enqueued ahead (or snoozed) when they fall due, and row jobs a scan inserted already due.")
		if err != nil {
			return err
		}
		sw, err := newWaker(jobs.QueueControl, controlFetchCooldown, "scan_wakeups_total",
			"Notifications sent to start the partition scans a tick or a scan inserted.")
		if err != nil {
			return err
		}
		f.Waker, wake = w, w.At
		f.ScanWaker, wakeScans = sw, sw.At
	}
	set, err := workers.New(workers.Config{
		Pool:                 f.WorkPool,
		TickPool:             f.TickPool,
		DispatchLanes:        f.DispatchLanes,
		Filter:               cfg.Filter,
		Running:              workers.RunningOf(cfg.Reconcilers),
		BatchSize:            cfg.BatchSize,
		PartitionCount:       cfg.PartitionCount,
		BudgetPartitionCount: cfg.BudgetPartitionCount,
		RiverSchema:          cfg.RiverSchema,
		Logger:               cfg.Logger,
		Stats:                stats,
		Observer:             observers{f.Metrics, cfg.Observer},
		RowBatch:             cfg.RowBatch,
		RowStatements:        cfg.RowStatements,
		Lookahead:            lookaheads(cfg.Reconcilers, cfg.Lookahead),
		Wake:                 wake,
		WakeScans:            wakeScans,
		Settings:             cfg.Settings,
	})
	if err != nil {
		return err
	}
	f.Workers = set
	if cfg.ExtraWorkers != nil {
		if err := cfg.ExtraWorkers(set.Workers()); err != nil {
			return fmt.Errorf("extra workers: %w", err)
		}
	}
	middleware := append([]rivertype.Middleware{f.Metrics.Middleware()}, set.Middleware()...)
	if cfg.Tracing {
		middleware = append(middleware, tracing.RiverMiddleware())
	}
	if !cfg.DisableJobLogs {
		// Row workers write one line per action to the job's own log, kept
		// in its metadata (capped) and shown in River UI: what the action
		// did, without a time (the attempt's, shown beside it) or the row's
		// ids (the job's args, on the same page). River's GIN index over
		// metadata keeps an entry for every distinct value it ever held, so
		// a line of the same few words for a million jobs costs it a
		// posting list, where a line naming its row cost an entry per job
		// (docs/performance.md, "What a row job costs river_job's GIN
		// indexes").
		middleware = append(middleware, riverlog.NewMiddleware(func(w io.Writer) slog.Handler {
			return slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: dropTime})
		}, &riverlog.MiddlewareConfig{MaxSizeBytes: 4096}))
	}
	queues := map[string]river.QueueConfig{
		// Ticks, one at a time (workers.Set.Middleware): each plans over
		// every partition of its table and locks every child and index
		// while it runs, so several at once would need most of a default
		// lock table (max_locks_per_transaction 64 × max_connections 100
		// = 6,400 slots) and fail with "out of shared memory" next to
		// other work. A few workers, so that the ticks due at one
		// instant come in one fetch. Scans: few, short, and never stuck
		// behind ticks or rows.
		jobs.QueueTicks:   {MaxWorkers: workers.TickWorkers, FetchCooldown: 10 * time.Millisecond, FetchPollInterval: notifiedPollInterval(cfg)},
		jobs.QueueControl: {MaxWorkers: controlWorkers, FetchCooldown: controlFetchCooldown, FetchPollInterval: notifiedPollInterval(cfg)},
		jobs.QueueRows:    {MaxWorkers: cfg.RowWorkers, FetchCooldown: cfg.RowFetchCooldown},
	}
	for _, r := range cfg.running() {
		if _, ok := queues[r.Queue()]; !ok {
			// A queue of a reconciler's own (the trims), one job at a
			// time: long deletes that must never hold a worker or a
			// connection the other reconcilers need. Only when a
			// reconciler that uses it runs: an idle queue still polls, and
			// every poll counts in the idle cost. Such jobs are not in a
			// hurry: polled every 5 s (an insert's notification still
			// wakes it at once).
			queues[r.Queue()] = river.QueueConfig{MaxWorkers: 1, FetchPollInterval: max(notifiedPoll, cfg.FetchPollInterval)}
		}
	}
	var reindex river.PeriodicSchedule // nil: River's daily schedule
	if cfg.ReindexInterval > 0 {
		reindex = river.PeriodicInterval(cfg.ReindexInterval)
	}
	client, err := river.NewClient(riverpgxv5.New(f.RiverPool), &river.Config{
		Schema:                      cfg.RiverSchema,
		ID:                          cfg.ClientID,
		Logger:                      riverLogger(cfg.Logger),
		Queues:                      queues,
		FetchCooldown:               cmp.Or(cfg.InsertNotifyCooldown, cfg.RowFetchCooldown),
		FetchPollInterval:           cfg.FetchPollInterval,
		JobTimeout:                  workers.RowTimeout,
		RescueStuckJobsAfter:        cfg.RescueStuckJobsAfter,
		CompletedJobRetentionPeriod: cfg.CompletedJobRetention,
		ReindexerSchedule:           reindex,
		Hooks:                       set.Hooks(),
		Middleware:                  middleware,
		PeriodicJobs:                periodicJobs,
		PollOnly:                    cfg.PollOnly,
		Workers:                     set.Workers(),
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	f.Client = client
	{
		// The reconcilers' listeners.
		insert := func(ctx context.Context, params []river.InsertManyParams) error {
			if _, err := client.InsertMany(ctx, params); err != nil {
				return err
			}
			// River notifies an insert at most once per fetch cooldown
			// per queue; a stream of notified rows would otherwise wait
			// for the next poll every other batch.
			if wake != nil {
				wake(time.Now())
			}
			return nil
		}
		for _, r := range cfg.running() {
			if r.Listen == nil {
				continue
			}
			l, err := r.Listen(workers.ListenEnv{Pool: f.WorkPool, Filter: cfg.Filter, Settings: cfg.Settings, Insert: insert,
				Logger: cfg.Logger.With("reconciler", r.Name), Listening: cfg.Listening})
			if err != nil {
				return fmt.Errorf("%s: %w", r.Name, err)
			}
			if l == nil {
				continue
			}
			if cfg.PollOnly {
				// Notifications need LISTEN, which polling rules out: the
				// rows would wait for the ticks, against what the settings
				// asked for.
				var flags []string
				for _, s := range r.Settings {
					flags = append(flags, "--"+s.Flag)
				}
				return &ConfigError{Flag: "poll-only", Field: "PollOnly", Value: "true",
					Problem: fmt.Sprintf("reconciler %s listens for Postgres notifications with these settings (%s), which polling rules out "+
						"(its rows would wait for its ticks, every %s): change those settings or leave --poll-only out",
						r.Name, strings.Join(flags, ", "), cfg.Reconcilers[r.Name])}
			}
			f.listeners = append(f.listeners, l)
		}
	}
	if !cfg.DisableTakeover {
		taker, err := takeover.New(takeover.Config{Client: client, DB: f.RiverPool, Wake: wake, Logger: cfg.Logger})
		if err != nil {
			return err
		}
		f.Taker = taker
		f.Metrics.Registry().MustRegister(takeoverMetrics(taker)...)
		f.handoff = &handoff{f: f}
		f.Metrics.Registry().MustRegister(f.handoff.metrics()...)
	}
	return nil
}

// notifiedPollInterval is how often the ticks' and the scans' queues poll.
// Every job of theirs is announced when it is inserted: ticks by the
// leader's periodic inserts, which are far more than River's limit of one
// insert notification per queue per fetch cooldown apart, or by a process
// handing over the ticks; scans by the ScanWaker after the tick or scan that
// inserted them committed (River's own notification of a second insert
// within the limit is held back); both, when made available again after a
// failure, by River's scheduler, which notifies too. So their polls only
// find jobs inserted while this process's listener was reconnecting: every
// 5 s, not every second (a poll of an idle queue is one statement, and at
// idle a fleet's statements are mostly its polls and ticks; see
// docs/performance.md, "Idle: the ticks' fetches"). Polling only
// (PollOnly), it is the configured interval. The rows' queue keeps it:
// other services insert there, announced by their own clients' limits.
func notifiedPollInterval(cfg Config) time.Duration {
	if cfg.PollOnly {
		return cfg.FetchPollInterval
	}
	return max(notifiedPoll, cfg.FetchPollInterval)
}

// notifiedPoll is the least poll interval of the queues whose every insert
// is announced (notifiedPollInterval).
const notifiedPoll = 5 * time.Second

// controlFetchCooldown is the scans' queue's fetch cooldown, and the
// granule of the ScanWaker's notifications: River fetches no more often.
const controlFetchCooldown = 10 * time.Millisecond

// newConnTag returns a random tag for the connections of one process: 16
// hex digits, so that "ffreconcile-river <tag>" stays within Postgres's 63
// bytes of application_name.
func newConnTag() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("connection tag: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// takeoverMetrics exports what taker did.
func takeoverMetrics(taker *takeover.Taker) []prometheus.Collector {
	counter := func(name, help string, labels prometheus.Labels, v func(takeover.Counts) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ffreconcile", Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v(taker.Counts())) })
	}
	const jobsHelp = "Running jobs of worker processes gone without a clean stop that this process rescued, by outcome."
	return []prometheus.Collector{
		counter("takeover_processes_total", "Worker processes gone without a clean stop (no connection left) this process took over from.",
			nil, func(c takeover.Counts) int64 { return c.Processes }),
		counter("takeover_leaderships_total", "River leaderships of dead worker processes this process resigned on their behalf.",
			nil, func(c takeover.Counts) int64 { return c.Leaderships }),
		counter("takeover_jobs_total", jobsHelp, prometheus.Labels{"outcome": "retried"}, func(c takeover.Counts) int64 { return c.Retried }),
		counter("takeover_jobs_total", jobsHelp, prometheus.Labels{"outcome": "discarded"}, func(c takeover.Counts) int64 { return c.Discarded }),
		counter("takeover_jobs_total", jobsHelp, prometheus.Labels{"outcome": "cancelled"}, func(c takeover.Counts) int64 { return c.Cancelled }),
	}
}

// RecommendedMaxLocks is FlowFabric's recommended max_locks_per_transaction.
const RecommendedMaxLocks = 256

// checkServer warns about server settings that hurt a fleet (serverWarnings).
func checkServer(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	s, err := store.ReadServerSettings(ctx, pool)
	if err != nil {
		logger.Warn("could not read the server's settings", "error", err)
		return
	}
	for _, w := range serverWarnings(s) {
		logger.Warn(w.msg, w.attrs...)
	}
}

// serverWarning is one log line of checkServer.
type serverWarning struct {
	msg   string
	attrs []any
}

// serverWarnings says what is wrong with s for a fleet:
//   - a lock table small for 256-way partitioned tables: a statement over a
//     whole table (a tick, a due-rows count) locks every child and each of
//     its indexes, up to ~1,800 locks, and the table holds
//     max_locks_per_transaction × max_connections of them in all;
//   - autovacuum off: River deletes a row of river_job for every finished
//     job and the reconcilers update ff_* rows in place, so without
//     vacuum no space is reused and river_job alone grows by the size of
//     every job ever run (measured: 229 MB in a soak's first five minutes,
//     655 MB in fifteen with the row count flat; docs/benchmarks.md, "Soak").
func serverWarnings(s store.ServerSettings) []serverWarning {
	var out []serverWarning
	if s.MaxLocksPerTransaction < RecommendedMaxLocks {
		out = append(out, serverWarning{
			"max_locks_per_transaction is below FlowFabric's recommended 256: whole-table statements over 256 partitions " +
				"need up to ~1,800 lock slots each, and concurrent ones can fail with \"out of shared memory\"",
			[]any{"max_locks_per_transaction", s.MaxLocksPerTransaction, "lock_table_slots", s.MaxLocksPerTransaction * s.MaxConnections}})
	}
	if !s.Autovacuum {
		out = append(out, serverWarning{
			"autovacuum is off on this server: nothing reclaims the space of finished River jobs (deleted from river_job " +
				"after their retention) or of updated ff_* rows, so river_job grows without bound; turn it on " +
				"(ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf())", nil})
	}
	return out
}

// lookaheads is the window of each enabled reconciler that looks ahead, for
// workers.Config: its tick interval plus margin, at most
// jobs.RiverSchedulerInterval; none when margin is negative.
func lookaheads(intervals map[string]time.Duration, margin time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	if margin < 0 {
		return out
	}
	for _, r := range workers.All() {
		if interval, ok := intervals[r.Name]; ok && r.Lookahead {
			out[r.Name] = min(interval+margin, jobs.RiverSchedulerInterval)
		}
	}
	return out
}

// Start registers the process in the heartbeat table, which refuses it
// (*ConfigMismatchError) when a live process of its River schema is
// configured differently, then starts the River client, the heartbeat and
// the waker. They run until Stop, whatever becomes of ctx.
func (f *Fleet) Start(ctx context.Context) error {
	if f.stopBeat == nil {
		cfg := f.Config
		hb := heartbeat.Config{
			Schema: cfg.RiverSchema, ClientID: f.Client.ID(), ConnTag: f.ConnTag,
			Shape: cfg.shapeJSON(), Accept: cfg.acceptLive, Logger: cfg.Logger,
		}
		if f.Taker != nil {
			hb.TakeOver = func(ctx context.Context, w store.DepartedWorker) (bool, error) {
				res, err := f.Taker.TakeOver(ctx, w)
				if res.Resigned {
					f.handoff.afterTakeover(ctx, w.ClientID)
				}
				return res.More, err
			}
		}
		proc, err := heartbeat.Register(ctx, f.RiverPool, hb)
		if err != nil {
			return err
		}
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); proc.Run(bctx, heartbeat.DefaultInterval) }()
		f.stopBeat = func() { cancel(); <-done }
	}
	if f.Waker != nil && f.stopWaker == nil {
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		var wg sync.WaitGroup
		for _, w := range []*fetchwake.Waker{f.Waker, f.ScanWaker} {
			wg.Go(func() { w.Run(wctx) })
		}
		f.stopWaker = func() { cancel(); wg.Wait() }
	}
	if len(f.listeners) > 0 && f.stopListeners == nil {
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		var wg sync.WaitGroup
		for _, l := range f.listeners {
			wg.Go(func() { l.Run(lctx) })
		}
		f.stopListeners = func() { cancel(); wg.Wait(); f.stopListeners = nil }
	}
	// River treats the end of Start's context as StopAndCancel: every
	// running job's context ends at once. The fleet stops through Stop
	// only, which gives running jobs their time first (a signal ending
	// ctx must not cut them short), and resigns before it hands off.
	return f.Client.Start(context.WithoutCancel(ctx))
}

// Stop stops fetching new jobs and waits for running ones until ctx ends,
// then cancels what is still running and waits for it to return. A leader
// with other processes left starts the ticks for them once it has resigned
// (handoff). The heartbeat row goes last: a process configured otherwise
// may start once this one has stopped working.
func (f *Fleet) Stop(ctx context.Context) error {
	if f.stopBeat != nil {
		defer func() { f.stopBeat(); f.stopBeat = nil }()
	}
	if f.stopWaker != nil {
		defer f.stopWaker()
	}
	// No new jobs from the listeners once stopping: what is notified from
	// now on waits for the next process's listener or tick.
	if f.stopListeners != nil {
		f.stopListeners()
	}
	handOff := f.handoff != nil && f.handoff.leadsWithOthers(ctx)
	if err := f.Client.Stop(ctx); err != nil {
		hard, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err2 := f.Client.StopAndCancel(hard); err2 != nil {
			return fmt.Errorf("stop: %w; then cancel: %w", err, err2)
		}
	}
	// River's client resigns its leadership as it stops, after its running
	// jobs have returned; the ticks start only now, for the next leader.
	if handOff {
		f.handoff.afterStop(ctx)
	}
	return nil
}

// Close stops the waker and the heartbeat if Stop did not, then closes the
// pools.
func (f *Fleet) Close() {
	if f.stopListeners != nil {
		f.stopListeners()
	}
	if f.stopWaker != nil {
		f.stopWaker()
	}
	if f.stopBeat != nil {
		f.stopBeat()
		f.stopBeat = nil
	}
	for _, lane := range f.DispatchLanes {
		lane.Close()
	}
	f.TickPool.Close()
	f.WorkPool.Close()
	f.RiverPool.Close()
}

// pools are the process's connection pools by name, as metrics label them.
func (f *Fleet) pools() map[string]*pgxpool.Pool {
	m := map[string]*pgxpool.Pool{"river": f.RiverPool, "work": f.WorkPool, "tick": f.TickPool}
	for i, lane := range f.DispatchLanes {
		m[fmt.Sprintf("dispatch-%d", i)] = lane
	}
	return m
}

// observers passes lateness to each of its non-nil observers.
type observers []workers.Observer

func (o observers) Lateness(reconciler string, d time.Duration) {
	for _, x := range o {
		if x != nil {
			x.Lateness(reconciler, d)
		}
	}
}

// dropTime leaves the time out of a job log line.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
