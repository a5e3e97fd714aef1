// Package workers implements the River workers of the reconciler fleet. Each
// reconciler (a Reconciler, declared in its own file and listed in the
// registry) has a periodic job. For most it is a tick that finds the
// partitions holding due rows, fanning out a scan per partition that
// enqueues one row job per due row, whose worker applies the action to one
// row (define); the tick and scan workers are generic, the row worker is
// the reconciler's own. Some act on a partition's rows in the partition job
// itself (retention's trim, defineSteps), one acts in its periodic job
// alone (outbox retention, defineSingle).
//
// Exactly-once effect. A row job can run twice: River's batch completer
// marks jobs completed shortly after they return, so a process killed in
// between leaves the job to be rescued and run again, and a scan may enqueue
// a row whose previous job has just finished. Every row action is therefore
// a statement that re-checks its condition under the row lock and changes
// nothing when it no longer holds (see package store). Completing the job
// inside the action's transaction (river.JobCompleteTx) would close even
// that window, at the cost of one more single-row UPDATE of river_job per
// row, which costs much of the throughput for no change in effect
// (docs/performance.md). Scans do complete themselves in their
// transaction, once per batch, to free their unique slot for a
// continuation.
//
// Row batching. Row workers ask a coalescer (internal/coalesce) for their
// row: rows of one partition asked for while a statement is in flight go
// together in the next one, each with its own re-check and its own result.
// See docs/design.md, "Row batching".
package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Timeouts. Row actions are single statements taking milliseconds; scans
// read one batch and insert it; ticks run one query. The limits are generous
// against lock waits yet keep a wedged job from holding its unique slot long.
// RescueStuckJobsAfter (set by the fleet) must exceed the largest of them.
const (
	TickTimeout = 10 * time.Second
	ScanTimeout = 20 * time.Second
	RowTimeout  = 10 * time.Second
)

// Ticks of one process. The leader inserts the ticks due at one instant
// together, and a process fetches up to TickWorkers of them in one fetch:
// fetched one by one (one worker), each tick cost a fetch of its own and
// River one more after the last, most of an idle fleet's statements
// (docs/performance.md, "Idle: the ticks' fetches"). They still run one at
// a time (Middleware). A fetched tick waits at most TickWait for those
// ahead of it, then fails (the next tick replaces it, see
// jobs.TickMaxAttempts): with its own TickTimeout it stays within
// ScanTimeout, so River never rescues a tick still waiting.
const (
	TickWorkers = 8
	TickWait    = ScanTimeout - TickTimeout
)

// Defaults of Config.
const (
	DefaultBatchSize            = 1000
	DefaultRowBatch             = 64
	DefaultRowStatements        = 2
	DefaultBudgetPartitionCount = 32
)

// Config is what the workers share.
type Config struct {
	// Pool runs the reconcilers' own SQL. Keep it separate from River's
	// pool so a burst of row actions cannot starve River's leadership and
	// fetch queries. Required.
	Pool *pgxpool.Pool
	// TickPool runs the ticks' due-partition queries. Give it
	// plan_cache_mode force_generic_plan: a tick's query spans all 256
	// children and prunes at run time either way, and a custom plan
	// re-plans over every child at every tick where a cached generic plan
	// costs a fraction of a millisecond (docs/performance.md). Defaults to
	// Pool.
	TickPool *pgxpool.Pool
	// DispatchLanes run the dependency reconciler's single-event dispatches,
	// partition p's on lane p % len(DispatchLanes), each statement naming
	// the partition's leaves (store.DispatchCompletionsOnLeaves). Give each
	// lane one connection with plan_cache_mode force_generic_plan: a lane
	// then plans a statement once per partition it serves, and caches
	// plans for its share of the 256 partitions only. Defaults to none:
	// every dispatch runs on Pool with custom plans.
	DispatchLanes []*pgxpool.Pool
	// Filter limits the fleet to one tenant. Defaults to none: every row.
	Filter store.Filter
	// Running is the set of reconcilers the fleet ticks (the same in every
	// process of a River schema). It decides the rows of a reconciler that
	// shares rows with another (Reconciler.DueIn): in a fleet running lease
	// expiry and attempt timeout, each takes its share of the expired
	// leases. Defaults to none known: every reconciler takes all its due
	// rows, as in a fleet running it alone.
	Running Running
	// BatchSize is the most rows one partition scan enqueues. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// PartitionCount is the number of flow partitions scanned (0..N-1).
	// Defaults to jobs.PartitionCount.
	PartitionCount int
	// BudgetPartitionCount is the number of budget partitions the budget
	// reset walks (0..N-1), FlowFabric's num_budget_partitions: a budget of
	// a partition beyond it is never reset. Defaults to
	// DefaultBudgetPartitionCount.
	BudgetPartitionCount int
	// RiverSchema is the schema of River's tables; ticks read it to skip
	// partitions whose row jobs are still queued. Defaults to
	// jobs.DefaultRiverSchema.
	RiverSchema string
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Stats receives the counters. Defaults to a new Stats.
	Stats *Stats
	// Observer receives lateness measurements. Defaults to one that
	// discards them.
	Observer Observer
	// RowBatch is the most row actions of one partition that share one
	// statement (1 turns sharing off). Row jobs stay one per row: each asks
	// for its own row and gets its own result, but while a statement is in
	// flight the rows asked for meanwhile queue and go together in the next
	// one. See internal/coalesce. Defaults to DefaultRowBatch.
	RowBatch int
	// RowStatements is the most row-action statements of one reconciler in
	// flight at once: with a statement running while the next one fills, a
	// small server stays busy and rows batch under load
	// (docs/performance.md). Raise it on a larger server. Defaults to
	// DefaultRowStatements.
	RowStatements int
	// Lookahead is, per reconciler with Reconciler.Lookahead, how far ahead
	// of their deadline its ticks and scans take rows; absent or 0: only
	// rows already due. A row falling due within it gets its row job at
	// once, scheduled one millisecond after its deadline (the first instant
	// its action's re-check holds), so it starts at the deadline instead of
	// after the next tick and its burst of partition scans. Give it at
	// least the reconciler's tick interval, so rows are found by the tick
	// before the one after their deadline, and at most
	// jobs.RiverSchedulerInterval: a row job enqueued ahead that finds its
	// row changed (a lease renewed meanwhile) does nothing, and the wider
	// the window the more of those. Defaults to none.
	Lookahead map[string]time.Duration
	// Wake, when set, is called with the time a row job enqueued ahead, or
	// snoozed, falls due, once its insert is committed (for a snooze: late
	// enough for River's completer to have stored it). River fetches such a
	// job at its next poll unless something wakes its producers;
	// internal/fetchwake does. Scans also call it with the time of their
	// commit when they insert row jobs already due, which River's own
	// insert notification may hold back (one per queue per fetch
	// cooldown). Defaults to none.
	Wake func(time.Time)
	// WakeScans, when set, is called once a tick's or a scan's insert of
	// scans into jobs.QueueControl is committed. River notifies an insert
	// at most once per queue per fetch cooldown, so a second tick's scans
	// inserted right after the first's announce nothing and would wait for
	// the queue's poll; internal/fetchwake announces them. Defaults to
	// none.
	WakeScans func(time.Time)
	// Settings are the reconcilers' own settings (each reconciler's
	// Settings); absent ones take their defaults.
	Settings Values
}

// Observer receives measurements the counters cannot carry.
type Observer interface {
	// Lateness reports, for an applied row action, the time from the row's
	// deadline (as the scan saw it) to the action's commit.
	Lateness(reconciler string, d time.Duration)
}

type nopObserver struct{}

func (nopObserver) Lateness(string, time.Duration) {}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.TickPool == nil {
		c.TickPool = c.Pool
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PartitionCount = cmp.Or(c.PartitionCount, jobs.PartitionCount)
	c.BudgetPartitionCount = cmp.Or(c.BudgetPartitionCount, DefaultBudgetPartitionCount)
	c.RiverSchema = cmp.Or(c.RiverSchema, jobs.DefaultRiverSchema)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Stats == nil {
		c.Stats = NewStats()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	c.RowBatch = cmp.Or(c.RowBatch, DefaultRowBatch)
	c.RowStatements = cmp.Or(c.RowStatements, DefaultRowStatements)
	return c
}

// validate reports the first unusable setting, naming its field.
func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("workers: Config.Pool is required")
	case c.BatchSize < 1:
		return fmt.Errorf("workers: Config.BatchSize %d must be at least 1", c.BatchSize)
	case c.PartitionCount < 1 || c.PartitionCount > jobs.PartitionCount:
		return fmt.Errorf("workers: Config.PartitionCount %d is out of range 1..%d", c.PartitionCount, jobs.PartitionCount)
	case c.BudgetPartitionCount < 1 || c.BudgetPartitionCount > jobs.PartitionCount:
		return fmt.Errorf("workers: Config.BudgetPartitionCount %d is out of range 1..%d", c.BudgetPartitionCount, jobs.PartitionCount)
	case c.RowBatch < 1:
		return fmt.Errorf("workers: Config.RowBatch %d must be at least 1", c.RowBatch)
	case c.RowStatements < 1:
		return fmt.Errorf("workers: Config.RowStatements %d must be at least 1", c.RowStatements)
	}
	for s, d := range c.Settings {
		if problem := s.Validate(d); problem != "" {
			return fmt.Errorf("workers: Config.Settings --%s %s: %s", s.Flag, d, problem)
		}
	}
	for _, r := range registry {
		if r.RefusesFilter != nil && !c.Filter.Empty() && r.OnlyWith != nil && c.Settings.On(r.OnlyWith) {
			return fmt.Errorf("workers: --%s with Config.Filter (%s): %w", r.OnlyWith.Flag, c.Filter, r.RefusesFilter)
		}
	}
	for name, d := range c.Lookahead {
		if _, ok := ByName(name); !ok {
			return fmt.Errorf("workers: Config.Lookahead names an unknown reconciler %q", name)
		}
		if d > jobs.RiverSchedulerInterval {
			return fmt.Errorf("workers: Config.Lookahead[%s] %s is above %s", name, d, jobs.RiverSchedulerInterval)
		}
	}
	return nil
}

// Set is the fleet's workers and the hooks that go with them.
type Set struct {
	workers *river.Workers
	d       *deps
}

// New builds every worker of every reconciler. All kinds are registered even
// when a reconciler's tick is disabled: the leader's rescuer discards stuck
// jobs of kinds its client has no worker for.
func New(cfg Config) (*Set, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Set{workers: river.NewWorkers(), d: &deps{cfg: cfg, tickSem: make(chan struct{}, 1), tickWait: TickWait}}
	for _, r := range registry {
		if err := r.register(s.workers, s.d); err != nil {
			return nil, fmt.Errorf("workers of %s: %w", r.Name, err)
		}
	}
	return s, nil
}

// Workers returns the workers, for river.Config.Workers.
func (s *Set) Workers() *river.Workers { return s.workers }

// Stats returns the counters the workers update.
func (s *Set) Stats() *Stats { return s.d.cfg.Stats }

// Tick runs one tick of r as its periodic job does, enqueuing its partition
// scans through client, and counts it in Stats. The benchmark times it: a
// tick's work from its start to its fan-out, without River's fetch of the
// tick job around it.
func (s *Set) Tick(ctx context.Context, client *river.Client[pgx.Tx], r *Reconciler) error {
	return s.d.tick(ctx, client, r)
}

// PlanTicks runs on db, once each, every statement the reconcilers' ticks run
// on the tick pool, over a window ending at the epoch and with no partition
// to count; it only reads. On a connection with plan_cache_mode
// force_generic_plan the first run of each builds the generic plan the
// connection then keeps, which costs far more than each tick after
// (docs/performance.md, "Tick plans, and row statements that read whole
// partitions"). The benchmark runs it on each tick connection, so that its
// window starts from the state of a process that has ticked before, as it
// does with warm connections.
func (s *Set) PlanTicks(ctx context.Context, db store.DB) error {
	cfg := s.d.cfg
	for _, r := range registry {
		if !r.HasDue() {
			continue
		}
		due := s.d.due(r)
		if _, err := due.Partitions(ctx, db, store.NoLowerBound, 0, r.Partitions(cfg), cfg.Filter); err != nil {
			return fmt.Errorf("plan %s tick: %w", r.Name, err)
		}
		if due.Always {
			continue
		}
		if _, err := due.Counts(ctx, db, 0, []int16{}, cfg.Filter); err != nil {
			return fmt.Errorf("plan %s tick: %w", r.Name, err)
		}
	}
	return nil
}

// deps is what the workers of one Set share.
type deps struct {
	cfg Config
	// tickSem holds the one tick of this process that runs (Middleware).
	tickSem chan struct{}
	// tickWait is TickWait, shorter in tests (export_test.go).
	tickWait time.Duration
	// ahead: row jobs known to be queued for a future start.
	ahead queuedAhead
	// clock and rowClock, when set (by tests only, export_test.go),
	// stand in for time.Now in now and rowNow.
	clock, rowClock atomic.Pointer[func() time.Time]
}

// now is the process's clock as ticks and scans read it: time.Now, unless a
// test has stubbed it (as River's services take a stubbable time
// generator), so that a test decides when a row counts as due rather than
// racing the wall clock. Row actions re-check their rows under lock by the
// real clock (store.NowMs) either way.
func (d *deps) now() time.Time { return stubbedOrNow(&d.clock) }

// rowNow is the process's clock as a row job's wait for its deadline reads
// it (beforeDeadline), stubbed apart from now: a test that freezes its
// scans' clock so a row is found not yet due must not have that row's job,
// started on time, read the frozen clock and snooze.
func (d *deps) rowNow() time.Time { return stubbedOrNow(&d.rowClock) }

// stubbedOrNow reads clock's stub, or time.Now when none is set.
func stubbedOrNow(clock *atomic.Pointer[func() time.Time]) time.Time {
	if f := clock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

func (d *deps) log() *slog.Logger { return d.cfg.Logger }

// due returns what makes r's rows due in this fleet (Reconciler.DueIn).
func (d *deps) due(r *Reconciler) *store.Due { return r.DueIn(d.cfg.Running) }

// stats returns r's counters.
func (d *deps) stats(r *Reconciler) *Counters { return d.cfg.Stats.For(r.Name) }

// wakeScans announces r's scans just committed to the producers of their
// queue (Config.WakeScans); partition jobs on a queue of their own (the
// trims) are in no hurry, left to its insert notification and poll.
func (d *deps) wakeScans(r *Reconciler) {
	if d.cfg.WakeScans != nil && r.scanQueue == jobs.QueueControl {
		d.cfg.WakeScans(time.Now())
	}
}

// lookahead is how far ahead of their deadline r takes rows.
func (d *deps) lookahead(r *Reconciler) time.Duration {
	if !r.Lookahead {
		return 0
	}
	return max(0, d.cfg.Lookahead[r.Name])
}
