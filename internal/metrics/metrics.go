// Package metrics exposes the fleet's Prometheus metrics: what each
// reconciler did (from workers.Stats), tick durations and lateness
// histograms, the due rows and the age of the oldest of them, River job
// counts by kind and state, River's leadership, the connection pools and
// the build.
package metrics

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

const namespace = "ffreconcile"

// Config is what the metrics read.
type Config struct {
	// Stats are the counters exported. Required.
	Stats *workers.Stats
	// Pool reads the due-rows gauge and River's job counts. Required.
	Pool *pgxpool.Pool
	// RiverSchema is the schema of River's tables. Required.
	RiverSchema string
	// Filter is the fleet's tenant filter. Defaults to none.
	Filter store.Filter
	// Logger receives failed reads. Defaults to slog.Default().
	Logger *slog.Logger
	// DueCap bounds each due-rows count. Defaults to 100,000.
	DueCap int
	// Settings are the reconcilers' settings, as the fleet's: they decide
	// when rows are due (Reconciler.DueAt), and a reconciler turned on by a
	// setting that is off has nothing due (its oldest due row's age is 0).
	// Absent ones take their defaults.
	Settings workers.Values
	// PartitionCount and BudgetPartitionCount are the partition spaces the
	// oldest-due probe walks, as workers.Config's. Default to
	// jobs.PartitionCount and workers.DefaultBudgetPartitionCount.
	PartitionCount, BudgetPartitionCount int
	// Intervals are the tick intervals of the reconcilers this process
	// runs, exported as tick_interval_seconds: the stall alert's threshold
	// is a few of them. They also say which rows a reconciler sharing rows
	// with another takes (workers.Reconciler.DueIn), for the due-rows and
	// oldest-due gauges. Defaults to none.
	Intervals map[string]time.Duration
	// ClientID returns this process's River client ID, read at scrape time,
	// for the leader gauge. Nil (or "") exports no leader gauge.
	ClientID func() string
	// Pools are the process's connection pools by name ("river", "work",
	// "tick"), exported with their use and waits. Defaults to none.
	Pools map[string]*pgxpool.Pool
	// CacheFor is how long the values read from the database are served
	// before a scrape starts a new read. Defaults to 5 s.
	CacheFor time.Duration
	// ReadTimeout bounds each of a scrape's reads (see DefaultReadTimeout).
	// Defaults to 3 s.
	ReadTimeout time.Duration
}

// Metrics is a registry with the fleet's collectors.
type Metrics struct {
	reg          *prometheus.Registry
	tickDuration *prometheus.HistogramVec
	jobDuration  *prometheus.HistogramVec
	lateness     *prometheus.HistogramVec
}

// New registers every collector.
func New(cfg Config) *Metrics {
	if cfg.DueCap <= 0 {
		cfg.DueCap = 100_000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.PartitionCount = cmp.Or(cfg.PartitionCount, jobs.PartitionCount)
	cfg.BudgetPartitionCount = cmp.Or(cfg.BudgetPartitionCount, workers.DefaultBudgetPartitionCount)
	cfg.CacheFor = cmp.Or(cfg.CacheFor, 5*time.Second)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, DefaultReadTimeout)
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		tickDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "tick_duration_seconds",
			Help:    "Time a reconciler tick took to find due partitions and enqueue their scans.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"reconciler"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "job_duration_seconds",
			Help:    "Time River jobs of this fleet took to work, by reconciler and step (tick, scan, row).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"reconciler", "step"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "lateness_seconds",
			Help: "Time from a row's deadline to the commit of the action that fixed it, for every reconciler with a deadline. " +
				"cancel_dispatch and cancel_reconcile have none: a pending cancel group is due as soon as it exists, " +
				"so there is no deadline to be late against; oldest_due_seconds shows how long their groups wait.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300},
		}, []string{"reconciler"}),
	}
	// Every reconciler with a deadline has its lateness series from the
	// start, so that a panel shows it empty rather than missing.
	for _, r := range workers.All() {
		if !r.HasScans() || !r.Due.Always {
			m.lateness.WithLabelValues(r.Name)
		}
	}
	intervals := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "tick_interval_seconds",
		Help: "Tick interval of each reconciler this process runs (absent: not run here). The stall alert compares oldest_due_seconds with a few of them.",
	}, []string{"reconciler"})
	for name, d := range cfg.Intervals {
		intervals.WithLabelValues(name).Set(d.Seconds())
	}
	m.reg.MustRegister(m.tickDuration, m.jobDuration, m.lateness, intervals,
		&statsCollector{stats: cfg.Stats},
		newDBCollector(cfg),
		newPoolCollector(cfg.Pools),
		buildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// buildInfo is ffreconcile_build_info, 1 with the binary's module version,
// Go version and VCS revision as labels ("unknown" where the build did not
// record one, e.g. under go test).
func buildInfo() prometheus.Collector {
	version, goVersion, revision := "unknown", "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = cmp.Or(bi.Main.Version, version)
		goVersion = cmp.Or(bi.GoVersion, goVersion)
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1; its labels say which build of the worker this process runs.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": goVersion, "revision": revision},
	})
	g.Set(1)
	return g
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry returns the registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Lateness implements workers.Observer.
func (m *Metrics) Lateness(reconciler string, d time.Duration) {
	m.lateness.WithLabelValues(reconciler).Observe(d.Seconds())
}

// Middleware times every job of the reconcilers' kinds.
func (m *Metrics) Middleware() rivertype.WorkerMiddleware {
	return river.WorkerMiddlewareFunc(func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
		start := time.Now()
		err := doInner(ctx)
		r, step, ok := workers.ByKind(job.Kind)
		if !ok {
			return err
		}
		d := time.Since(start).Seconds()
		if step == workers.StepTick {
			m.tickDuration.WithLabelValues(r.Name).Observe(d)
		}
		m.jobDuration.WithLabelValues(r.Name, string(step)).Observe(d)
		return err
	})
}

// statsCollector turns workers.Stats into counters at scrape time.
type statsCollector struct {
	stats *workers.Stats
}

var statDescs = []struct {
	name, help string
	get        func(workers.Snapshot) int64
}{
	{"ticks_total", "Reconciler ticks run by this process.", func(s workers.Snapshot) int64 { return s.Ticks }},
	{"partitions_due_total", "Partitions found holding rows due, or due within the lookahead, summed over ticks.", func(s workers.Snapshot) int64 { return s.PartitionsDue }},
	{"partitions_busy_total", "Due partitions a tick skipped because their row jobs were still queued.", func(s workers.Snapshot) int64 { return s.PartitionsBusy }},
	{"busy_rescans_total", "Partitions with queued row jobs a tick scanned anyway: they held more due rows than unfinished row jobs.", func(s workers.Snapshot) int64 { return s.BusyRescans }},
	{"follow_up_scans_total", "Scans a tick enqueued for partitions whose scan had already started.", func(s workers.Snapshot) int64 { return s.FollowUpScans }},
	{"scans_total", "Partition scans run.", func(s workers.Snapshot) int64 { return s.Scans }},
	{"scan_continuations_total", "Partition scans that continued themselves after a full batch.", func(s workers.Snapshot) int64 { return s.Continuations }},
	{"rows_examined_total", "Due rows read by partition scans.", func(s workers.Snapshot) int64 { return s.Examined }},
	{"row_jobs_enqueued_total", "Row jobs inserted by scans.", func(s workers.Snapshot) int64 { return s.Enqueued }},
	{"row_jobs_enqueued_ahead_total", "Row jobs inserted before their row's deadline, to start at it (a subset of row_jobs_enqueued_total).", func(s workers.Snapshot) int64 { return s.EnqueuedAhead }},
	{"row_jobs_already_queued_total", "Rows whose row job was already queued (River's unique skip, or a job this process saw queued for a later start).", func(s workers.Snapshot) int64 { return s.AlreadyQueued }},
	{"actions_applied_total", "Row actions that changed their row.", func(s workers.Snapshot) int64 { return s.Applied }},
	{"row_jobs_snoozed_total", "Row jobs that started before their row was due and snoozed until it.", func(s workers.Snapshot) int64 { return s.Snoozes }},
	{"rows_skipped_total", "Rows or jobs skipped as malformed or invalid, with a warning.", func(s workers.Snapshot) int64 { return s.Skipped }},
	{"scan_deadlock_retries_total", "Scan inserts run again at once after Postgres chose them as a deadlock's victim.", func(s workers.Snapshot) int64 { return s.DeadlockRetries }},
	{"errors_total", "Ticks, scans and row actions that returned an error (River retries them).", func(s workers.Snapshot) int64 { return s.Errors }},
}

var descs = func() []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(statDescs))
	for i, d := range statDescs {
		out[i] = prometheus.NewDesc(namespace+"_"+d.name, d.help, []string{"reconciler"}, nil)
	}
	return out
}()

var noopDesc = prometheus.NewDesc(namespace+"_actions_noop_total",
	"Row actions that changed nothing, by reason: no_longer_due (the row no longer qualified under its lock: renewed, resolved, "+
		"moved or deleted; a one-statement action cannot tell which), gone (already deleted), not_due_yet, locked (held by "+
		"another transaction, offered again next tick), flag_clear (a pending cancel group cancel_dispatch leaves for "+
		"cancel_reconcile to delete), members_live (one cancel_reconcile leaves for cancel_dispatch), lost_race (changed "+
		"by a transaction that committed while the action waited for its lock), not_suspended (a lapsed suspension of an "+
		"execution already resumed: left untouched, the timeout cleared).",
	[]string{"reconciler", "reason"}, nil)

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
	ch <- noopDesc
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.stats.Snapshot()
	for _, name := range workers.Names() {
		s := snap[name] // zero when the reconciler has not run yet
		for i, d := range statDescs {
			ch <- prometheus.MustNewConstMetric(descs[i], prometheus.CounterValue, float64(d.get(s)), name)
		}
		// Each reason the reconciler's statements can tell, from zero, and
		// any other that occurred.
		reasons := map[string]bool{}
		if r, ok := workers.ByName(name); ok {
			for _, why := range r.NoOpReasons {
				reasons[why.String()] = true
			}
		}
		for why := range s.NoOpsByReason {
			reasons[why] = true
		}
		for why := range reasons {
			ch <- prometheus.MustNewConstMetric(noopDesc, prometheus.CounterValue, float64(s.NoOpsByReason[why]), name, why)
		}
	}
}

// dbCollector reads the due-rows gauges, the oldest due rows, River's job
// counts and its leadership at scrape time, at most once per CacheFor
// however many scrapers ask. Only the first scrape waits for the read: a
// later one that finds the values older than CacheFor starts a new read and
// serves the last values meanwhile. A scrape then never waits for the
// database: on a loaded server the ~24 reads took 0.7-1.5 s, past a 2 s
// scrape's timeout now and then, and a scrape that times out makes the
// process look down (up 0) when only the database is slow, which
// database_up says.
//
// Every process reads them, not only River's leader: the oldest due row
// must still rise when the leader is gone or no process leads, which is
// when a stall matters; dashboards and alerts take the max across the
// fleet. The cost per process is one read every 5 s at most: a count of up
// to DueCap index entries and one index probe per partition per
// reconciler, and a count of the fleet's River jobs.
type dbCollector struct {
	cfg      Config
	due      *prometheus.Desc
	outside  *prometheus.Desc
	oldest   *prometheus.Desc
	riverJob *prometheus.Desc
	leader   *prometheus.Desc
	up       *prometheus.Desc
	// gauges are the running reconcilers' own (workers.Gauge), by name.
	gauges map[*workers.Gauge]*prometheus.Desc

	mu         sync.Mutex
	last       time.Time
	metrics    []prometheus.Metric
	refreshing bool // a read is under way in the background
}

func newDBCollector(cfg Config) *dbCollector {
	gauges := map[*workers.Gauge]*prometheus.Desc{}
	for _, r := range workers.All() {
		if _, runs := cfg.Intervals[r.Name]; !runs {
			continue
		}
		for i := range r.Gauges {
			g := &r.Gauges[i]
			gauges[g] = prometheus.NewDesc(namespace+"_"+g.Name, g.Help, nil, nil)
		}
	}
	return &dbCollector{
		gauges: gauges,
		cfg:    cfg,
		due: prometheus.NewDesc(namespace+"_due_rows", "Rows due for a reconciler that pass this fleet's tenant filter (counted up to a cap).",
			[]string{"reconciler"}, nil),
		outside: prometheus.NewDesc(namespace+"_due_rows_outside_filter", "Due rows this fleet's tenant filter leaves to other fleets (skipped by filter).",
			[]string{"reconciler"}, nil),
		oldest: prometheus.NewDesc(namespace+"_oldest_due_seconds",
			"Seconds since the oldest row due for a reconciler (passing this fleet's tenant filter) fell due; 0 when none is. "+
				"Rises steadily while a reconciler stalls. Pending cancel groups are due from their enqueue; retention's rows "+
				"from their terminal time plus the retention (0 without one).",
			[]string{"reconciler"}, nil),
		riverJob: prometheus.NewDesc(namespace+"_river_jobs",
			"River jobs of this fleet's kinds, by reconciler, kind and state (every state, 0 when it holds none; "+
				"discarded: jobs that ran out of retries).",
			[]string{"reconciler", "kind", "state"}, nil),
		leader: prometheus.NewDesc(namespace+"_leader",
			"1 when this process's River client holds the fleet's leadership (river_leader, unexpired), else 0; "+
				"absent when it could not be read. Exactly one process of a fleet should report 1.", nil, nil),
		up: prometheus.NewDesc(namespace+"_database_up", "1 when the last scrape could read the database.", nil, nil),
	}
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.due
	ch <- c.outside
	ch <- c.oldest
	ch <- c.riverJob
	ch <- c.leader
	ch <- c.up
	for _, d := range c.gauges {
		ch <- d
	}
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if c.metrics == nil {
		// The first scrape reads (other scrapes wait for it).
		c.metrics, c.last = c.read(), time.Now()
	} else if time.Since(c.last) > c.cfg.CacheFor && !c.refreshing {
		c.refreshing = true
		go func() {
			m := c.read()
			c.mu.Lock()
			defer c.mu.Unlock()
			c.metrics, c.last, c.refreshing = m, time.Now(), false
		}()
	}
	metrics := c.metrics
	c.mu.Unlock()
	for _, m := range metrics {
		ch <- m
	}
}

// DefaultReadTimeout bounds each of a scrape's reads (two per reconciler, one of
// River's jobs, one of its leader) rather than the scrape as a whole, so
// that a slow database makes a scrape slower but does not starve the reads
// that come last: ten reconcilers' counts sharing one budget once left the
// River job gauge empty on a loaded server.
const DefaultReadTimeout = 3 * time.Second

// inReadTx runs read in a transaction of its own in which Postgres stops any
// statement after ReadTimeout (statement_timeout; the context, a second
// later, only backs it up) and plans without JIT. The oldest-due probe is
// costed as if each partition's probe read every child of the table, which
// passes jit_above_cost: on a session with JIT on, compiling its ~1,800
// expressions took 20 s for a read of a few index entries (the fleet's work
// pool has JIT off; this holds whatever pool the metrics are given).
func (c *dbCollector) inReadTx(read func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ReadTimeout+time.Second)
	defer cancel()
	tx, err := c.cfg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('jit', 'off', true)`,
		strconv.FormatInt(c.cfg.ReadTimeout.Milliseconds(), 10)); err != nil {
		return err
	}
	return read(ctx, tx)
}

func (c *dbCollector) read() []prometheus.Metric {
	var out []prometheus.Metric
	up := 1.0
	now := store.NowMs()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	parts := workers.Config{PartitionCount: c.cfg.PartitionCount, BudgetPartitionCount: c.cfg.BudgetPartitionCount}
	running := workers.RunningOf(c.cfg.Intervals)
	for _, r := range workers.All() {
		// The rows r takes in this fleet: with reconcilers sharing rows,
		// its share (Reconciler.DueIn), so their due rows add up.
		if !r.HasScans() {
			continue // no Due: its periodic job acts by itself
		}
		due := r.DueIn(running)
		if !r.On(c.cfg.Settings) {
			// Nothing is due for a reconciler its settings leave off.
			gauge(c.oldest, 0, r.Name)
			continue
		}
		dueAt := r.DueAt(now, c.cfg.Settings)
		var dc store.DueCount
		err := c.inReadTx(func(ctx context.Context, tx pgx.Tx) (err error) {
			dc, err = due.Count(ctx, tx, dueAt, c.cfg.Filter, c.cfg.DueCap)
			return err
		})
		if err != nil {
			c.cfg.Logger.Warn("metrics: count due rows", "reconciler", r.Name, "error", err)
			up = 0
		} else {
			gauge(c.due, float64(dc.Due), r.Name)
			if !c.cfg.Filter.Empty() {
				gauge(c.outside, float64(dc.OutsideFilter), r.Name)
			}
		}
		var (
			at    int64
			found bool
		)
		err = c.inReadTx(func(ctx context.Context, tx pgx.Tx) (err error) {
			at, found, err = due.Oldest(ctx, tx, dueAt, r.Partitions(parts), c.cfg.Filter)
			return err
		})
		if err != nil {
			c.cfg.Logger.Warn("metrics: find the oldest due row", "reconciler", r.Name, "error", err)
			up = 0
			continue
		}
		age := 0.0
		if found {
			age = max(0, float64(dueAt-at)/1000)
		}
		gauge(c.oldest, age, r.Name)
	}
	for g, d := range c.gauges {
		var v float64
		err := c.inReadTx(func(ctx context.Context, tx pgx.Tx) (err error) {
			v, err = g.Read(ctx, tx, c.cfg.Filter)
			return err
		})
		if err != nil {
			c.cfg.Logger.Warn("metrics: read a reconciler's gauge", "gauge", g.Name, "error", err)
			up = 0
			continue
		}
		gauge(d, v)
	}
	if err := c.readRiverJobs(gauge); err != nil {
		c.cfg.Logger.Warn("metrics: count River jobs", "error", err)
		up = 0
	}
	if c.cfg.ClientID != nil {
		if id := c.cfg.ClientID(); id != "" {
			var l *store.RiverLeader
			err := c.inReadTx(func(ctx context.Context, tx pgx.Tx) (err error) {
				l, err = store.CurrentRiverLeader(ctx, tx, c.cfg.RiverSchema)
				return err
			})
			if err != nil {
				c.cfg.Logger.Warn("metrics: read River's leader", "error", err)
				up = 0
			} else {
				leads := 0.0
				if l != nil && l.LeaderID == id && l.ExpiresIn > 0 {
					leads = 1
				}
				gauge(c.leader, leads)
			}
		}
	}
	gauge(c.up, up)
	return out
}

// riverJobKinds are the job kinds of the fleet, each with its reconciler:
// every one is exported in every state, 0 when it has no job there.
var riverJobKinds = func() map[string]string {
	out := map[string]string{}
	for _, r := range workers.All() {
		for _, k := range []string{r.TickKind(), r.ScanKind(), r.RowKind()} {
			if k != "" {
				out[k] = r.Name
			}
		}
	}
	return out
}()

// readRiverJobs counts the fleet's River jobs by kind and state, and passes
// each to gauge, zeros included.
//
// Cost: river_job's rows of kinds ff.%, every state (River keeps finished
// jobs for their retention), once per CacheFor at most.
func (c *dbCollector) readRiverJobs(gauge func(*prometheus.Desc, float64, ...string)) error {
	var counts map[store.KindState]int64
	err := c.inReadTx(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		counts, err = store.FleetJobCounts(ctx, tx, c.cfg.RiverSchema)
		return err
	})
	if err != nil {
		return err
	}
	for k, r := range riverJobKinds {
		for _, st := range rivertype.JobStates() {
			gauge(c.riverJob, float64(counts[store.KindState{Kind: k, State: string(st)}]), r, k, string(st))
			delete(counts, store.KindState{Kind: k, State: string(st)})
		}
	}
	// Kinds of ff.* this build does not know (an older or newer fleet's).
	for k, v := range counts {
		gauge(c.riverJob, float64(v), reconcilerOfKind(k.Kind), k.Kind, k.State)
	}
	return nil
}

// reconcilerOfKind returns <name> of a kind ff.<name>.<step>.
func reconcilerOfKind(kind string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(kind, "ff."), ".")
	return name
}

// poolCollector exports the connection pools' use and waits, read from
// pgxpool's counters at scrape time (no database round trip).
type poolCollector struct {
	pools                                                          map[string]*pgxpool.Pool
	inUse, idle, maxConns, acquires, waits, waitSeconds, cancelled *prometheus.Desc
}

func newPoolCollector(pools map[string]*pgxpool.Pool) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_pool_"+name, help, []string{"pool"}, nil)
	}
	return &poolCollector{
		pools:    pools,
		inUse:    d("connections_in_use", "Connections of the pool acquired now (river: River's own; work: row actions, scans; tick: ticks)."),
		idle:     d("connections_idle", "Idle connections of the pool."),
		maxConns: d("connections_max", "The pool's size (--work-conns for the work pool)."),
		acquires: d("acquires_total", "Connections acquired from the pool."),
		waits: d("acquire_waits_total",
			"Acquires that found no idle connection and waited for one to be freed or opened: many mean the pool is too small for the load."),
		waitSeconds: d("acquire_wait_seconds_total", "Time acquires spent waiting for a connection (rate: connections waited for, on average)."),
		cancelled:   d("acquires_cancelled_total", "Acquires given up before a connection came (their context ended)."),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inUse, c.idle, c.maxConns, c.acquires, c.waits, c.waitSeconds, c.cancelled} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range c.pools {
		s := p.Stat()
		m := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(d, t, v, name)
		}
		m(c.inUse, prometheus.GaugeValue, float64(s.AcquiredConns()))
		m(c.idle, prometheus.GaugeValue, float64(s.IdleConns()))
		m(c.maxConns, prometheus.GaugeValue, float64(s.MaxConns()))
		m(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
		m(c.waits, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
		m(c.waitSeconds, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
		m(c.cancelled, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
	}
}
