package workers

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Reconciler is one reconciler of the fleet, declared once in its own file
// (workers/<name>.go, built by define) and listed once in the registry
// (registry.go). Everything that differs between reconcilers is here or in
// the code its fields point to: its name, default interval, partition
// space, what makes its rows due (its store.Due, in store/<name>.go), and
// its kinds of job with their workers (tick, scan and row for most; its
// args in jobs/<name>.go).
// The periodic set-up, the fleet, stats, metrics, `worker status` and the
// validation of job args all walk the registry.
type Reconciler struct {
	// Name is the reconciler's one name: in --reconcilers, its interval
	// flag, metrics labels and logs, and in its kinds, ff.<Name>.<step>.
	Name string
	// Interval is its default tick interval.
	Interval time.Duration
	// Due is what makes its rows due, and the queries that find them.
	Due *store.Due
	// Shares, when set, splits the rows it has in common with another
	// reconciler when the fleet runs both (DueIn). Nil: it takes all its
	// due rows, whatever else runs.
	Shares *Share
	// ScanLimit, when set, is the most due rows a partition's scan takes
	// per tick, with no continuation: the rest wait for the next tick
	// (cancel_backlog's 50 headers, FlowFabric's batch). Zero: a scan takes
	// Config.BatchSize rows at a time and continues until none is left.
	ScanLimit int
	// Lookahead: its ticks and scans take rows falling due before the next
	// tick, as row jobs that start at the row's deadline (Config.Lookahead).
	Lookahead bool
	// Tables are the FlowFabric tables its statements read or write, and
	// the objects of ours it needs (migrations.Object); a fleet that runs it
	// checks at start that they are migrated.
	Tables []string
	// AlwaysNeeds are objects of ours every fleet checks at start, running
	// this reconciler or not: its row jobs, which other services enqueue,
	// are worked by every fleet (delayed promotion's promote function).
	AlwaysNeeds []string
	// Partitions is the number of partitions its tick walks, 0..N-1.
	// Defaults to the flow partitions (Config.PartitionCount).
	Partitions func(Config) int
	// Lanes: its row actions run some statements on Config.DispatchLanes,
	// which a fleet opens only for a reconciler that says so.
	Lanes bool
	// Behind, when set, is how long after their Due.At its rows fall due
	// under the fleet's settings: its ticks and scans compare the rows with
	// now less it (DueAt).
	Behind func(Values) time.Duration
	// AllTenants: its rows belong to no tenant (budgets, worker
	// registrations), so it acts on every tenant's rows whatever the
	// fleet's tenant filter, as FlowFabric's loops do for them. These are
	// the only exceptions to "a filtered fleet changes no row of another
	// tenant": `worker run` with a filter names them at start
	// (AllTenantsOf), and the test that proves the rule for every other
	// reconciler exempts only them. Set exactly when Due.Tenant is not
	// (define panics otherwise).
	AllTenants bool
	// Settings are its own settings, beyond its interval: each a flag of
	// `worker run` (see Setting).
	Settings []*Setting
	// OnlyWith, when set, is the one of its Settings that turns it on: a
	// fleet runs it only while that setting is on (retention with
	// --retention), where every other reconciler runs unless left out.
	OnlyWith *Setting
	// RefusesFilter, when set, is why it cannot run in a fleet with a
	// tenant filter (outbox retention: the outboxes are every tenant's).
	RefusesFilter error
	// Listen, when set, builds what it runs beside its jobs while the
	// fleet runs (dependency's ff_completion listener); it returns nil
	// when the fleet's settings need none.
	Listen func(ListenEnv) (Runner, error)
	// Probe, when set, finds the partitions its tick fans out to, in place
	// of a Due (which it then has none of): flow summary's, whose rows are
	// flows with live members or members ended since a mark kept per
	// tenant filter.
	Probe func(ctx context.Context, db store.DB, nowMs int64, partitionCount int, f store.Filter) ([]int16, error)
	// Gauges are further gauges of its own that /metrics reads from the
	// database with the due-row gauges, each exported as
	// ffreconcile_<Name> (the cancel backlog's depth), in a fleet that
	// runs it.
	Gauges []Gauge
	// NoOpReasons are the reasons its row actions can change nothing for,
	// as far as its statements tell (metrics export each, zero until one
	// occurs). Defaults to NoOpNoLongerDue alone; none for a reconciler
	// without row actions.
	NoOpReasons []NoOpReason

	tickKind, scanKind, rowKind string
	// scanQueue is the queue of its partition jobs (for a reconciler
	// without them, of its periodic job).
	scanQueue string
	// tick is the periodic tick's args; tickOpts its insert options.
	tick     river.JobArgs
	tickOpts func() *river.InsertOpts
	// newScan builds the args of a scan of this reconciler.
	newScan func(jobs.ScanArgs) river.JobArgs
	// rowJob builds the row job of a scanned row (nil without row jobs).
	rowJob func(partition int16, row store.DueRow) river.JobArgs
	// register adds the tick, scan and row workers to ws.
	register func(ws *river.Workers, d *deps) error
	// registerRow adds the row worker to ws (nil without row jobs).
	registerRow func(ws *river.Workers, d *deps) error
	// newRowWorker builds the row worker, a river.Worker of the row args
	// (nil without row jobs): what registerRow adds, for tests that work
	// one job with rivertest.
	newRowWorker func(d *deps) any
	// validateJSON validates stored args by kind, as River would decode
	// them for the kind's worker.
	validateJSON map[string]func([]byte) error
}

// Share is a reconciler's part of the rows it has in common with another
// (lease expiry and attempt timeout both take an expired lease on an active
// execution). In a fleet running both, each takes only its part, so such a
// row gets one row job, of the reconciler the rule in the two parts' Dues
// gives it, never one of each (docs/design.md, "Attempt timeout and lease
// expiry"). The two parts split the common rows with none in both.
type Share struct {
	// With is the other reconciler's name.
	With string
	// Due is this reconciler's due rows in a fleet running both.
	Due *store.Due
}

// Running is the set of reconcilers a fleet ticks, by name.
type Running map[string]bool

// RunningOf returns the reconcilers of enabled (name → tick interval, as a
// fleet's configuration holds them) as a Running set.
func RunningOf(enabled map[string]time.Duration) Running {
	out := make(Running, len(enabled))
	for name := range enabled {
		out[name] = true
	}
	return out
}

// DueIn returns what makes r's rows due in a fleet ticking the reconcilers
// of running: its share (Shares.Due) when the fleet runs both r and the
// reconciler it shares rows with, else r.Due, all its due rows (also when
// running is nil: not known). Ticks, scans, the due-rows gauges and `worker
// status` all read it, so they agree on the rows r takes. Row actions do
// not: each re-checks its own condition in full, so a row job of r enqueued
// by anyone acts as r's action always did.
func (r *Reconciler) DueIn(running Running) *store.Due {
	if r.Shares != nil && running[r.Name] && running[r.Shares.With] {
		return r.Shares.Due
	}
	return r.Due
}

// TickKind is the kind of the reconciler's periodic tick.
func (r *Reconciler) TickKind() string { return r.tickKind }

// ScanKind is the kind of the reconciler's partition scans.
func (r *Reconciler) ScanKind() string { return r.scanKind }

// RowKind is the kind of the reconciler's row jobs (for delayed promotion
// also the ad-hoc promotion's); "" for one without row jobs.
func (r *Reconciler) RowKind() string { return r.rowKind }

// HasRowJobs reports whether the reconciler acts through row jobs
// (retention's trim acts on its partition's rows itself).
func (r *Reconciler) HasRowJobs() bool { return r.rowJob != nil }

// HasDue reports whether the reconciler has a Due: rows whose due time the
// tick, the gauges and `worker status` read. Those whose periodic job acts
// by itself (defineSingle) have none, nor those whose tick finds its
// partitions by a Probe of its own.
func (r *Reconciler) HasDue() bool { return r.Due != nil }

// TickArgs returns the args of the reconciler's periodic tick.
func (r *Reconciler) TickArgs() river.JobArgs { return r.tick }

// TickInsertOpts returns the insert options of the reconciler's periodic
// job: jobs.TickInsertOpts(), or its own.
func (r *Reconciler) TickInsertOpts() *river.InsertOpts { return r.tickOpts() }

// Queue returns the queue of its partition jobs (or of its periodic job,
// for one without them): jobs.QueueControl, or a queue of its own that the
// fleet runs one job at a time (jobs.QueueTrims).
func (r *Reconciler) Queue() string { return r.scanQueue }

// On reports whether a fleet with settings v can run r: it has no
// OnlyWith setting, or that one is on.
func (r *Reconciler) On(v Values) bool { return r.OnlyWith == nil || v.On(r.OnlyWith) }

// ListenEnv is what a reconciler's Listen is given.
type ListenEnv struct {
	// Pool runs its queries and gives its listening connection.
	Pool *pgxpool.Pool
	// Filter is the fleet's tenant filter; Settings its settings.
	Filter   store.Filter
	Settings Values
	// Insert inserts jobs through the fleet's River client and wakes the
	// producers of the rows' queue (River announces an insert at most once
	// per queue per fetch cooldown).
	Insert func(ctx context.Context, params []river.InsertManyParams) error
	// Logger receives its logs.
	Logger *slog.Logger
	// Listening, when set, is called each time it starts listening (a test
	// signal: notifications before it reach nobody).
	Listening func()
}

// Runner is something a reconciler runs beside its jobs: Run returns once
// ctx is done.
type Runner interface{ Run(ctx context.Context) }

// Gauge is a gauge of a reconciler's (Reconciler.Gauges) that /metrics
// reads from the database at each refresh, inside a read-only transaction
// with a statement timeout.
type Gauge struct {
	// Name is the metric's name after "ffreconcile_"; Help its help.
	Name, Help string
	// Read reads its value under the fleet's tenant filter.
	Read func(ctx context.Context, db store.DB, f store.Filter) (float64, error)
}

// String returns the name.
func (r *Reconciler) String() string { return r.Name }

// IntervalFlag is the name of its interval's flag of `worker run`, e.g.
// lease-expiry-interval.
func (r *Reconciler) IntervalFlag() string { return strings.ReplaceAll(r.Name, "_", "-") + "-interval" }

// scanArgs is a reconciler's scan args type: jobs.ScanArgs embedded in a
// struct of its own kind.
type scanArgs interface {
	~struct{ jobs.ScanArgs }
	river.JobArgs
}

// scanArgsWithOpts is a scan args type that names its own queue.
type scanArgsWithOpts interface {
	scanArgs
	river.JobArgsWithInsertOpts
}

// defineSteps completes r with the steps every reconciler has: T its tick
// args, S its partition job's args, worked by the worker scanWorker builds
// for a Set (the scan, or retention's trim). It checks what r declares and
// panics if the kinds do not follow ff.<Name>.<step>, which the registry's
// tests catch at once. Row jobs, where a reconciler has them, are define's.
func defineSteps[T river.JobArgs, S scanArgsWithOpts](r Reconciler, scanWorker func(r *Reconciler, d *deps) river.Worker[S]) *Reconciler {
	var (
		t T
		s S
	)
	if r.Partitions == nil {
		r.Partitions = flowPartitions
	}
	if (r.Due == nil) == (r.Probe == nil) {
		panic(fmt.Sprintf("reconciler %s: a tick finds its partitions by a Due or by a Probe: one of them", r.Name))
	}
	if r.Due != nil && r.AllTenants == r.Due.Tenant {
		panic(fmt.Sprintf("reconciler %s: AllTenants is %v and its Due's Tenant is %v; a reconciler's rows either belong to a tenant or to none",
			r.Name, r.AllTenants, r.Due.Tenant))
	}
	if sh := r.Shares; sh != nil && (sh.With == r.Name || sh.Due.Tenant != r.Due.Tenant || sh.Due.Always != r.Due.Always ||
		sh.Due.At != r.Due.At || sh.Due.ID != r.Due.ID || sh.Due.ID2 != r.Due.ID2 || sh.Due.N != r.Due.N) {
		panic(fmt.Sprintf("reconciler %s: its share with %s must be a part of its own rows: the same table, deadline, key and tenancy", r.Name, sh.With))
	}
	r.tick, r.tickOpts = t, jobs.TickInsertOpts
	r.tickKind, r.scanKind = t.Kind(), s.Kind()
	r.scanQueue = s.InsertOpts().Queue
	prefix := "ff." + r.Name + "."
	for _, k := range []string{r.tickKind, r.scanKind} {
		if len(k) <= len(prefix) || k[:len(prefix)] != prefix {
			panic(fmt.Sprintf("reconciler %s: kind %s is not %s<step>", r.Name, k, prefix))
		}
	}
	r.newScan = func(a jobs.ScanArgs) river.JobArgs { return S(struct{ jobs.ScanArgs }{a}) }
	def := &r
	r.register = func(ws *river.Workers, d *deps) error {
		if err := addWorker(ws, d, river.Worker[T](&tickWorker[T]{r: def, d: d})); err != nil {
			return err
		}
		if err := addWorker(ws, d, scanWorker(def, d)); err != nil {
			return err
		}
		if def.registerRow == nil {
			return nil
		}
		return def.registerRow(ws, d)
	}
	r.validateJSON = map[string]func([]byte) error{
		r.scanKind: func(b []byte) error { return jobs.ValidateJSON[S](r.scanKind, b) },
	}
	return def
}

// define completes r as a reconciler with row jobs: T its tick args, S its
// scan args, R its row args; rowJob turns a scanned row into a row job and
// rowWorker builds the row worker for a Set.
func define[T river.JobArgs, S scanArgsWithOpts, R river.JobArgs](r Reconciler,
	rowJob func(partition int16, row store.DueRow) R,
	rowWorker func(d *deps) river.Worker[R],
) *Reconciler {
	var row R
	if r.NoOpReasons == nil {
		r.NoOpReasons = []NoOpReason{NoOpNoLongerDue}
	}
	def := defineSteps[T, S](r, func(r *Reconciler, d *deps) river.Worker[S] { return &scanWorker[S]{r: r, d: d} })
	def.rowKind = row.Kind()
	if prefix := "ff." + def.Name + "."; !strings.HasPrefix(def.rowKind, prefix) || len(def.rowKind) == len(prefix) {
		panic(fmt.Sprintf("reconciler %s: kind %s is not %s<step>", def.Name, def.rowKind, prefix))
	}
	def.rowJob = func(p int16, x store.DueRow) river.JobArgs { return rowJob(p, x) }
	def.registerRow = func(ws *river.Workers, d *deps) error { return addWorker(ws, d, rowWorker(d)) }
	def.newRowWorker = func(d *deps) any { return rowWorker(d) }
	def.validateJSON[def.rowKind] = func(b []byte) error { return jobs.ValidateJSON[R](def.rowKind, b) }
	return def
}

// rowKey is a scanned row's key among its partition's rows.
func rowKey(x store.DueRow) string {
	return x.ID + "/" + x.ID2 + "/" + strconv.Itoa(int(x.N))
}

// flowPartitions is the partition space of the execution-scoped
// reconcilers: FlowFabric's flow partitions.
func flowPartitions(c Config) int { return c.PartitionCount }

// DueAt returns the time, in Unix ms, against which r's Due compares its
// rows' deadlines at nowMs under settings v: nowMs itself, or nowMs less
// r.Behind (for retention the retention: an execution is due once it has
// been terminal that long; for dependency the stale threshold).
func (r *Reconciler) DueAt(nowMs int64, v Values) int64 {
	if r.Behind != nil {
		return nowMs - r.Behind(v).Milliseconds()
	}
	return nowMs
}

// defineSingle completes r as a reconciler whose periodic job acts by
// itself, with no partitions to fan out over and no Due (outbox retention:
// both outboxes are walked by event id across partitions). P is its
// periodic job's args, with their own insert options (its queue), worked by
// the worker work builds for a Set.
func defineSingle[P interface {
	river.JobArgs
	river.JobArgsWithInsertOpts
}](r Reconciler, work func(r *Reconciler, d *deps) river.Worker[P]) *Reconciler {
	var p P
	if r.AllTenants || r.Shares != nil || r.Lookahead || r.Due != nil {
		panic(fmt.Sprintf("reconciler %s: a single periodic job has no rows of a tenant, shares, lookahead or Due", r.Name))
	}
	r.tick = p
	r.tickKind = p.Kind()
	r.tickOpts = func() *river.InsertOpts { o := p.InsertOpts(); return &o }
	r.scanQueue = p.InsertOpts().Queue
	if prefix := "ff." + r.Name + "."; !strings.HasPrefix(r.tickKind, prefix) || len(r.tickKind) == len(prefix) {
		panic(fmt.Sprintf("reconciler %s: kind %s is not %s<step>", r.Name, r.tickKind, prefix))
	}
	if r.Partitions == nil {
		r.Partitions = func(Config) int { return 0 }
	}
	r.NoOpReasons = []NoOpReason{}
	def := &r
	r.register = func(ws *river.Workers, d *deps) error { return addWorker(ws, d, work(def, d)) }
	r.validateJSON = map[string]func([]byte) error{}
	return def
}
