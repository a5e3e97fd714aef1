// Package workers implements the River workers of the reconciler fleet: for
// each reconciler a tick worker (find the partitions with due rows), a scan
// worker (enqueue one row job per due row of a partition) and a row worker
// (apply the action to one row).
//
// Exactly-once effect. A row job can run twice: River's batch completer
// marks jobs completed shortly after they return, so a process killed in
// between leaves the job to be rescued and run again, and a scan may enqueue
// a row whose previous job has just finished. Every row action is therefore
// a single statement that re-checks its condition under the row lock and
// changes nothing when it no longer holds (see package store). Completing the
// job inside the action's transaction (river.JobCompleteTx) would close even
// that window, but it costs one more single-row UPDATE of river_job per row,
// measured at about 0.5 ms on a 2-core machine, which halves throughput for
// no change in effect. Scans do complete themselves in their transaction,
// once per batch, to free their unique slot for a continuation.
//
// Row batching. The lease, suspension and promotion row workers ask a
// coalescer (internal/coalesce) for their row: rows of one partition asked
// for while a statement is in flight go together in the next one, each with
// its own re-check and its own result. See docs/design.md, "Row batching".
package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
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

// Config is what the workers share.
type Config struct {
	// Pool runs the reconcilers' own SQL. Keep it separate from River's
	// pool so a burst of row actions cannot starve River's leadership and
	// fetch queries.
	Pool *pgxpool.Pool
	// TickPool, when set, runs the ticks' due-partition queries. Give it
	// plan_cache_mode force_generic_plan: a tick's query spans all 256 children and prunes
	// at run time either way, and a custom plan re-plans over 256 children
	// at every tick (~10 ms of Postgres CPU) where a cached generic plan
	// costs ~0.1 ms. Nil uses Pool.
	TickPool *pgxpool.Pool
	// Filter limits the fleet to one tenant; empty lets every row through.
	Filter store.Filter
	// BatchSize is the most rows one partition scan enqueues.
	BatchSize int
	// PartitionCount is the number of flow partitions scanned (0..N-1).
	PartitionCount int
	// RiverSchema is the schema of River's tables (default "river"); ticks
	// read it to skip partitions whose row jobs are still queued.
	RiverSchema string
	// Logger receives structured logs.
	Logger *slog.Logger
	// Stats receives the counters; nil allocates one.
	Stats *Stats
	// Observer receives lateness measurements; nil discards them.
	Observer Observer
	// RowBatch is the most row actions of one partition that share one
	// statement (default 64; 1 turns sharing off). Row jobs stay one per
	// row: each asks for its own row and gets its own result, but while a
	// statement is in flight the rows asked for meanwhile queue and go
	// together in the next one. See internal/coalesce.
	RowBatch int
	// Lookahead is, per deadline reconciler (lease expiry, suspension
	// timeout, delayed promotion), how far ahead of their deadline its ticks
	// and scans take rows; absent or 0: only rows already due. A row falling
	// due within it gets its row job at once, scheduled one millisecond
	// after its deadline (the first instant its action's re-check holds), so
	// it starts at the deadline instead of after the next tick and its
	// burst of partition scans. Give it at least the reconciler's tick
	// interval, so rows are found by the tick before the one after their
	// deadline, and at most jobs.RiverSchedulerInterval: a row job enqueued
	// ahead that finds its row changed (a lease renewed meanwhile) does
	// nothing, and the wider the window the more of those.
	Lookahead map[string]time.Duration
	// Wake, when set, is called with the time a row job enqueued ahead, or
	// snoozed, falls due, once its insert is committed (for a snooze: late
	// enough for River's completer to have stored it). River fetches such a
	// job at its next poll unless something wakes its producers;
	// internal/fetchwake does.
	Wake func(time.Time)
	// RowStatements is the most row-action statements of one reconciler in
	// flight at once (default 2): with a statement running while the next
	// one fills, a 2-core server stays busy, and rows queue and batch under
	// load (with the fleet's defaults 2 carried ~21 rows per statement and
	// ran 2,900 rows/s; 4 with smaller fetches carried 4 and ran 1,600; see
	// docs/performance.md). Raise it on a larger server.
	RowStatements int
}

// Observer receives measurements the counters cannot carry.
type Observer interface {
	// Lateness reports, for an applied row action, the time from the row's
	// deadline (as the scan saw it) to the action's commit.
	Lateness(reconciler string, d time.Duration)
}

type nopObserver struct{}

func (nopObserver) Lateness(string, time.Duration) {}

// Row batching defaults (measured in docs/performance.md).
const (
	DefaultRowBatch      = 64
	DefaultRowStatements = 2
)

func (c *Config) setDefaults() {
	if c.RowBatch <= 0 {
		c.RowBatch = DefaultRowBatch
	}
	if c.RowStatements <= 0 {
		c.RowStatements = DefaultRowStatements
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.PartitionCount <= 0 {
		c.PartitionCount = jobs.PartitionCount
	}
	if c.RiverSchema == "" {
		c.RiverSchema = "river"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Stats == nil {
		c.Stats = NewStats()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
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
	if cfg.Pool == nil {
		return nil, errors.New("workers: Config.Pool is required")
	}
	cfg.setDefaults()
	s := &Set{workers: river.NewWorkers(), d: newDeps(cfg)}
	for _, name := range Implemented() {
		if err := registrars[name](s.workers, s.d); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// registrars adds each reconciler's tick, scan and row workers.
var registrars = map[string]func(*river.Workers, *deps) error{
	LeaseExpiry:       registerLeaseExpiry,
	DelayedPromotion:  registerDelayedPromotion,
	SuspensionTimeout: registerSuspensionTimeout,
	CancelDispatch:    registerCancelDispatch,
	CancelReconcile:   registerCancelReconcile,
}

// Implemented lists the reconcilers this package has workers for, in the
// order of jobs.Reconcilers.
func Implemented() []string {
	var out []string
	for _, name := range jobs.Reconcilers {
		if _, ok := registrars[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// Workers returns the workers, for river.Config.Workers.
func (s *Set) Workers() *river.Workers { return s.workers }

// Stats returns the counters the workers update.
func (s *Set) Stats() *Stats { return s.d.cfg.Stats }

// Hooks returns the hooks for river.Config.Hooks: args of this project's
// kinds are validated when inserted through the client (the insert fails
// with the reason). They are validated again when a job starts (see
// validating and Middleware), which catches jobs inserted by other clients
// (a non-Go River client, raw SQL).
//
// Row jobs scheduled within River's scheduler interval are inserted
// available instead of scheduled (see availableAhead).
func (s *Set) Hooks() []rivertype.Hook {
	return []rivertype.Hook{jobs.ValidateOnInsert, river.HookInsertBeginFunc(availableAhead)}
}

// availableAhead inserts a row job scheduled at most
// jobs.RiverSchedulerInterval from now as available, keeping its
// scheduled_at, instead of scheduled. River's fetch takes an available job
// only once its scheduled_at has passed, and River itself leaves jobs in
// that state: its scheduler makes scheduled jobs available up to one
// interval before their time, and a snooze that short stays available.
// Inserted as scheduled, a job due in a second would wait for the leader's
// scheduler, which runs every 5 s, and start up to 5 s late.
func availableAhead(_ context.Context, params *rivertype.JobInsertParams) error {
	if params.Queue == jobs.QueueRows && params.State == rivertype.JobStateScheduled && params.ScheduledAt != nil &&
		time.Until(*params.ScheduledAt) <= jobs.RiverSchedulerInterval {
		params.State = rivertype.JobStateAvailable
	}
	return nil
}

// Middleware returns the workers' River middleware, for
// river.Config.Middleware.
//
// Ticks are serialised within a process: each tick's query plans over all
// 256 children of its table and takes an AccessShareLock on every child and
// each of its indexes (up to ~1,800 for ff_exec_core) until it returns. Five
// reconcilers ticking at once (they all run on start) would need most of a
// default lock table (max_locks_per_transaction 64 × max_connections 100 =
// 6,400 slots) and fail with "out of shared memory" next to other work. One
// at a time they cost ~20 ms each and stay far below it.
//
// A job whose args River could not decode never reaches its worker (see
// validating) and fails before it; the middleware then cancels it with the
// reason instead of leaving it to River's retries, which would fail the same
// way every time.
func (s *Set) Middleware() []rivertype.Middleware {
	var mu sync.Mutex
	return []rivertype.Middleware{river.WorkerMiddlewareFunc(
		func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
			if strings.HasSuffix(job.Kind, ".tick") {
				mu.Lock()
				defer mu.Unlock()
			}
			var decoded bool
			err := doInner(context.WithValue(ctx, argsDecodedKey{}, &decoded))
			if err != nil && !decoded {
				if verr := jobs.ValidateEncoded(job.Kind, job.EncodedArgs); verr != nil {
					return s.d.cancelInvalid(job, verr)
				}
			}
			return err
		})}
}

// argsDecodedKey carries, from Middleware to validating, the flag saying
// River decoded the job's args and handed them to the worker.
type argsDecodedKey struct{}

// validating wraps every worker: it validates the args River has just
// decoded for it and cancels a job whose args are invalid, with its reason
// (visible in River UI) instead of retrying it. Validating the decoded value
// instead of decoding the JSON once more in a work-begin hook saves a
// decode per job, which was 7 % of the worker's CPU under load.
type validating[T river.JobArgs] struct {
	river.Worker[T]
	d *deps
}

// Work implements river.Worker.
func (w *validating[T]) Work(ctx context.Context, job *river.Job[T]) error {
	if decoded, ok := ctx.Value(argsDecodedKey{}).(*bool); ok {
		*decoded = true
	}
	if v, ok := any(job.Args).(jobs.Validator); ok {
		if err := v.Validate(); err != nil {
			return w.d.cancelInvalid(job.JobRow, fmt.Errorf("invalid %s job: %w", job.Kind, err))
		}
	}
	return w.Worker.Work(ctx, job)
}

// addWorker registers w, wrapped in validating.
func addWorker[T river.JobArgs](ws *river.Workers, d *deps, w river.Worker[T]) error {
	return river.AddWorkerSafely[T](ws, &validating[T]{Worker: w, d: d})
}

// cancelInvalid counts and logs a job with invalid args and cancels it.
func (d *deps) cancelInvalid(job *rivertype.JobRow, err error) error {
	d.cfg.Stats.For(reconcilerOf(job.Kind)).Skipped.Add(1)
	d.log().Warn("cancelling job with invalid args", "kind", job.Kind, "job_id", job.ID,
		"args", string(job.EncodedArgs), "error", err)
	return river.JobCancel(err)
}

// reconcilerOf maps a kind ("ff.lease_expiry.release") to its reconciler
// ("lease_expiry").
func reconcilerOf(kind string) string {
	rest, ok := strings.CutPrefix(kind, "ff.")
	if !ok {
		return kind
	}
	name, _, _ := strings.Cut(rest, ".")
	return name
}

type deps struct {
	cfg Config
	// releases, promotions and suspensions batch row actions by partition.
	releases    *coalesce.Coalescer[int16, store.LeaseRef, store.ReleaseResult]
	promotions  *coalesce.Coalescer[int16, string, store.PromoteResult]
	suspensions *coalesce.Coalescer[int16, string, store.SuspensionExpireResult]
	// ahead: row jobs known to be queued for a future start.
	ahead queuedAhead
}

func newDeps(cfg Config) *deps {
	d := &deps{cfg: cfg}
	batch := coalesce.Config{MaxBatch: cfg.RowBatch, InFlight: cfg.RowStatements, Timeout: RowTimeout}
	d.releases = coalesce.New(batch, func(ctx context.Context, p int16, refs []store.LeaseRef) ([]store.ReleaseResult, error) {
		return store.ReleaseExpiredLeases(ctx, cfg.Pool, p, refs, store.NowMs())
	})
	d.promotions = coalesce.New(batch, func(ctx context.Context, p int16, ids []string) ([]store.PromoteResult, error) {
		return store.PromoteDelayedMany(ctx, cfg.Pool, p, ids, store.NowMs())
	})
	d.suspensions = coalesce.New(batch, func(ctx context.Context, p int16, ids []string) ([]store.SuspensionExpireResult, error) {
		return store.ExpireSuspensions(ctx, cfg.Pool, p, ids, store.NowMs())
	})
	return d
}

func (d *deps) log() *slog.Logger { return d.cfg.Logger }

// lookahead is how far ahead of their deadline reconciler name takes rows.
func (d *deps) lookahead(name string) time.Duration {
	return max(0, d.cfg.Lookahead[name])
}

// tickWindow is what a tick found: the partitions to scan, and for the
// deadline reconcilers a way to tell which hold rows not yet due.
type tickWindow struct {
	parts []int16 // partitions holding rows due by the horizon, those already due first
	nowMs int64   // the tick's now
	// notYetDue returns the partitions holding rows due at or after nowMs
	// and by the horizon; nil without a lookahead.
	notYetDue func(ctx context.Context) (map[int16]bool, error)
	// dueCounts returns, for each of parts, its rows due at nowMs; nil for
	// the cancel reconcilers, whose busy partitions are always skipped.
	dueCounts func(ctx context.Context, parts []int16) (map[int16]int, error)
}

// dueQuery is a store.Due*Partitions function.
type dueQuery func(ctx context.Context, db store.DB, fromMs, horizonMs int64, partitionCount int, f store.Filter) ([]int16, error)

// tickQueries are the queries a deadline reconciler's tick runs on the tick
// pool: the probe for partitions with rows due by a time, and the count of
// due rows of the partitions it finds busy.
type tickQueries struct {
	due   dueQuery
	count store.DueCountsQuery
}

// deadlineTicks maps each deadline reconciler to its tick's queries.
var deadlineTicks = map[string]tickQueries{
	LeaseExpiry:       {store.DueLeasePartitions, store.CountDueLeases},
	SuspensionTimeout: {store.DueSuspensionPartitions, store.CountDueSuspensions},
	DelayedPromotion:  {store.DuePromotionPartitions, store.CountDuePromotions},
}

// PlanTicks runs on db, once each, every statement the reconcilers' ticks run
// on the tick pool, over a window ending at the epoch and with no partition
// to count; it only reads. On a connection with plan_cache_mode
// force_generic_plan the first run of each builds the generic plan the
// connection then keeps: 90–180 ms of the server's CPU per statement on a
// 2-core machine, against ~0.1 ms for each tick after (docs/performance.md,
// "Tick plans, and row statements that read whole partitions"). The
// benchmark runs it on each tick connection, so that its window starts from
// the state of a process that has ticked before, as it does with warm
// connections.
func (s *Set) PlanTicks(ctx context.Context, db store.DB) error {
	cfg := s.d.cfg
	for name, q := range deadlineTicks {
		if _, err := q.due(ctx, db, store.NoLowerBound, 0, cfg.PartitionCount, cfg.Filter); err != nil {
			return fmt.Errorf("plan %s tick: %w", name, err)
		}
		if _, err := q.count(ctx, db, 0, []int16{}, cfg.Filter); err != nil {
			return fmt.Errorf("plan %s tick: %w", name, err)
		}
	}
	if _, err := store.DuePendingCancelPartitions(ctx, db, cfg.PartitionCount, cfg.Filter); err != nil {
		return fmt.Errorf("plan cancel ticks: %w", err)
	}
	return nil
}

// duePartitions returns the partitions of reconciler name holding rows due
// by its horizon (now plus its lookahead), those with rows already due first.
// A tick's scans start in the order it inserts them, over the burst that
// follows it (~0.6 s at 500 due rows/s on 2 cores); rows already due are
// late, while rows falling due later in the window mostly still start on
// time from a scan late in the burst. The second query (a cached generic
// plan, ~3 ms) runs only when the window holds anything, so an idle fleet
// pays nothing for it; a third, for the partitions holding rows not yet due
// (notYetDue), and a fourth, counting the busy partitions' due rows
// (dueCounts), only when fanOut finds a due partition busy.
func (d *deps) duePartitions(ctx context.Context, name string) (tickWindow, error) {
	query, count := deadlineTicks[name].due, deadlineTicks[name].count
	w := tickWindow{nowMs: store.NowMs()}
	w.dueCounts = func(ctx context.Context, parts []int16) (map[int16]int, error) {
		return count(ctx, d.tickDB(), w.nowMs, parts, d.cfg.Filter)
	}
	ahead := d.lookahead(name).Milliseconds()
	parts, err := query(ctx, d.tickDB(), store.NoLowerBound, w.nowMs+ahead, d.cfg.PartitionCount, d.cfg.Filter)
	if err != nil || ahead == 0 || len(parts) == 0 {
		w.parts = parts
		return w, err
	}
	due, err := query(ctx, d.tickDB(), store.NoLowerBound, w.nowMs, d.cfg.PartitionCount, d.cfg.Filter)
	if err != nil {
		return w, err
	}
	isDue := make(map[int16]bool, len(due))
	for _, p := range due {
		isDue[p] = true
	}
	w.parts = append(make([]int16, 0, len(parts)), due...)
	for _, p := range parts {
		if !isDue[p] {
			w.parts = append(w.parts, p)
		}
	}
	w.notYetDue = func(ctx context.Context) (map[int16]bool, error) {
		ps, err := query(ctx, d.tickDB(), w.nowMs, w.nowMs+ahead, d.cfg.PartitionCount, d.cfg.Filter)
		if err != nil {
			return nil, err
		}
		out := make(map[int16]bool, len(ps))
		for _, p := range ps {
			out[p] = true
		}
		return out, nil
	}
	return w, nil
}

// snoozeWakeFloor: River's batch completer stores a snooze within about two
// of its 50 ms ticks; a wake-up sent before that would find the job still
// running and be lost.
const snoozeWakeFloor = 100 * time.Millisecond

// wake asks for River's producers to be woken at t (see Config.Wake).
func (d *deps) wake(t time.Time) {
	if d.cfg.Wake != nil {
		d.cfg.Wake(t)
	}
}

// snooze returns the error that snoozes a row job for wait and asks for the
// wake-up that starts it again then. River leaves a snooze of at most its
// scheduler interval available (with a future scheduled_at) for the next
// fetch after it; a longer one waits as scheduled.
func (d *deps) snooze(reconciler string, wait time.Duration) error {
	d.cfg.Stats.For(reconciler).Snoozes.Add(1)
	if wait <= jobs.RiverSchedulerInterval {
		d.wake(time.Now().Add(max(wait, snoozeWakeFloor)))
	}
	return river.JobSnooze(wait)
}

// beforeDeadline snoozes a row job that starts before the deadline it was
// enqueued for (deadlineMs, from its args; 0: none) until just after it. A
// job enqueued ahead is scheduled for its deadline by the database's clock,
// while its action re-checks the row by this process's clock; without this a
// job started a little early by clock skew would find its row not yet due,
// do nothing and leave the row to a later tick. Waits longer than River's
// scheduler interval are not snoozed: such a job was not enqueued ahead by
// this fleet, and its action's re-check decides.
func (d *deps) beforeDeadline(reconciler string, deadlineMs int64) error {
	if deadlineMs <= 0 {
		return nil
	}
	wait := time.Until(time.UnixMilli(deadlineMs + 1))
	if wait <= 0 || wait > jobs.RiverSchedulerInterval {
		return nil
	}
	return d.snooze(reconciler, wait)
}

// tickDB is the pool for the ticks' queries.
func (d *deps) tickDB() store.DB {
	if d.cfg.TickPool != nil {
		return d.cfg.TickPool
	}
	return d.cfg.Pool
}

// applied records an applied row action and its lateness when the row job
// carried the deadline it was scanned with.
func (d *deps) applied(reconciler string, deadlineMs int64) {
	d.cfg.Stats.For(reconciler).Applied.Add(1)
	if deadlineMs > 0 {
		d.cfg.Observer.Lateness(reconciler, time.Since(time.UnixMilli(deadlineMs)))
	}
}

// jobLog returns the logger whose output River keeps with the job (shown in
// River UI) when the riverlog middleware is installed, else one that
// discards: the process log already has the debug line.
func jobLog(ctx context.Context) *slog.Logger {
	if l, ok := riverlog.LoggerSafely(ctx); ok {
		return l
	}
	return discardLogger
}

var discardLogger = slog.New(slog.DiscardHandler)

// scanArgs maps each reconciler to the args of its partition scans.
var scanArgs = map[string]func(p int16, after *jobs.ScanCursor, follows int64) river.JobArgs{
	LeaseExpiry:       leaseScan.next,
	SuspensionTimeout: suspensionScan.next,
	DelayedPromotion:  promotionScan.next,
	CancelDispatch:    cancelDispatchScan.next,
	CancelReconcile:   cancelReconcileScan.next,
}

// tick is one tick of reconciler name: find its due partitions, then
// enqueue their scans through client (see fanOut).
func (d *deps) tick(ctx context.Context, client *river.Client[pgx.Tx], name string) error {
	var (
		win tickWindow
		err error
	)
	if _, ok := deadlineTicks[name]; ok {
		win, err = d.duePartitions(ctx, name)
	} else {
		win, err = duePendingCancelPartitions(ctx, d)
	}
	if err != nil {
		d.cfg.Stats.For(name).Errors.Add(1)
		return err
	}
	return fanOut(ctx, client, d, name, win)
}

// Tick runs one tick of reconciler name (LeaseExpiry, …) as its periodic
// job does, enqueuing its partition scans through client, and counts it in
// Stats. The benchmark times it: a tick's work from its start to its
// fan-out, without River's fetch of the tick job around it.
func (s *Set) Tick(ctx context.Context, client *river.Client[pgx.Tx], name string) error {
	if _, ok := scanArgs[name]; !ok {
		return fmt.Errorf("tick: unknown reconciler %q", name)
	}
	return s.d.tick(ctx, client, name)
}

// rowKinds maps each reconciler to the kind of its row jobs.
var rowKinds = map[string]string{
	LeaseExpiry:       jobs.KindLeaseRelease,
	SuspensionTimeout: jobs.KindSuspensionExpire,
	DelayedPromotion:  jobs.KindPromote,
	CancelDispatch:    jobs.KindCancelDispatch,
	CancelReconcile:   jobs.KindCancelReconcile,
}

// fanOut inserts one scan job per due partition, except partitions whose row
// jobs are still waiting in the queue (busy, see store.QueuedRowJobs): those
// are skipped, or, when they hold rows not yet due within the reconciler's
// lookahead, scanned from the tick's now on (aheadCursor), so those rows are
// still enqueued ahead. A busy partition holding more due rows than
// unfinished row jobs has rows no scan enqueued (inserted after the tick
// that would have found them, or left out of every window by late ticks); it
// is scanned in full, or under a queue that stays behind those rows would
// wait until it drained (27 s seen at 500 rows/s on 2 cores).
//
// A partition whose scan still waits in the queue needs no other; one whose
// scan has started gets a follow-up with a unique key of its own (see the
// jobs package's "Follow-up scans"), so the tick's insert never offers the
// key of a started scan, whose row River's completer may be locking.
func fanOut(ctx context.Context, client *river.Client[pgx.Tx], d *deps, name string, w tickWindow) error {
	c, scan := d.cfg.Stats.For(name), scanArgs[name]
	c.Ticks.Add(1)
	c.PartitionsDue.Add(int64(len(w.parts)))
	if len(w.parts) == 0 {
		return nil
	}
	// On the work pool (custom plans): the best index for these queries
	// depends on how many jobs of each state and kind the queue holds, which
	// a cached generic plan cannot see.
	queued, err := store.QueuedRowJobs(ctx, d.cfg.Pool, d.cfg.RiverSchema, jobs.QueueRows, rowKinds[name], time.UnixMilli(w.nowMs))
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s: %w", name, err)
	}
	scans, err := store.UnfinishedScans(ctx, d.cfg.Pool, d.cfg.RiverSchema, jobs.QueueControl, scan(0, nil, 0).Kind())
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s: %w", name, err)
	}
	busy := func(p int16) bool { return queued[p].Available > 0 }
	var busyParts []int16
	for _, p := range w.parts {
		if busy(p) {
			busyParts = append(busyParts, p)
		}
	}
	var (
		notYetDue map[int16]bool
		dueCount  map[int16]int
	)
	if len(busyParts) > 0 {
		if w.dueCounts != nil {
			if dueCount, err = w.dueCounts(ctx, busyParts); err != nil {
				c.Errors.Add(1)
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if w.notYetDue != nil {
			if notYetDue, err = w.notYetDue(ctx); err != nil {
				c.Errors.Add(1)
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	params := make([]river.InsertManyParams, 0, len(w.parts))
	aheadOnly, rescans, skippedBusy, waiting, followUps := 0, 0, 0, 0, 0
	for _, p := range w.parts {
		rescan := busy(p) && dueCount[p] > queued[p].Available+queued[p].Running
		var after *jobs.ScanCursor
		switch {
		case busy(p) && !rescan && !notYetDue[p]: // its due rows' jobs wait in the queue
			skippedBusy++
			continue
		case scans[p].Waiting: // its scan has read nothing yet
			waiting++
			continue
		case busy(p) && !rescan: // only its rows not yet due
			after = aheadCursor(w.nowMs)
			aheadOnly++
		case rescan:
			rescans++
		}
		if scans[p].Started != 0 {
			followUps++
		}
		params = append(params, river.InsertManyParams{Args: scan(p, after, scans[p].Started)})
	}
	c.PartitionsBusy.Add(int64(skippedBusy))
	c.BusyRescans.Add(int64(rescans))
	c.FollowUpScans.Add(int64(followUps))
	if len(params) == 0 {
		return nil
	}
	res, err := client.InsertMany(ctx, params)
	if err != nil {
		c.Errors.Add(1)
		return fmt.Errorf("%s: enqueue %d partition scans: %w", name, len(params), err)
	}
	skipped := 0
	for _, r := range res {
		if r.UniqueSkippedAsDuplicate {
			skipped++
		}
	}
	d.log().Debug("tick fanned out", "reconciler", name, "partitions_due", len(w.parts),
		"partitions_busy", skippedBusy, "busy_scanned_ahead_only", aheadOnly, "busy_rescanned", rescans,
		"scans_enqueued", len(params)-skipped, "follow_up_scans", followUps, "scans_already_queued", waiting+skipped)
	return nil
}

// aheadCursor starts a scan after every row due at nowMs: at nowMs − 1 with
// the largest ids, it takes rows whose deadline is nowMs or later.
func aheadCursor(nowMs int64) *jobs.ScanCursor {
	const maxUUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
	return &jobs.ScanCursor{AtMs: nowMs - 1, ID: maxUUID, ID2: maxUUID, N: math.MaxInt32}
}
