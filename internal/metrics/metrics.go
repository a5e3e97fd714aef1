// Package metrics exposes the fleet's Prometheus metrics: what each
// reconciler did (from workers.Stats), tick durations and lateness
// histograms, a due-rows gauge, and River job counts by kind and state.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

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
	// Retention is the fleet's retention: terminal executions older than
	// it are due for retention. Defaults to none: retention's due gauge is
	// not exported.
	Retention time.Duration
	// DependencyStaleThreshold is the dependency reconciler's stale
	// threshold: completion events committed longer ago are due (see
	// workers.Config.DependencyStaleThreshold).
	DependencyStaleThreshold time.Duration
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
			Help:    "Time from a row's deadline to the commit of the action that fixed it.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300},
		}, []string{"reconciler"}),
	}
	m.reg.MustRegister(m.tickDuration, m.jobDuration, m.lateness,
		&statsCollector{stats: cfg.Stats},
		newDBCollector(cfg),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
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
	{"actions_noop_total", "Row actions whose row no longer qualified under lock.", func(s workers.Snapshot) int64 { return s.NoOps }},
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

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.stats.Snapshot()
	for _, name := range append(workers.Names(), workers.OutboxRetentionName) {
		s := snap[name] // zero when the reconciler has not run yet
		for i, d := range statDescs {
			ch <- prometheus.MustNewConstMetric(descs[i], prometheus.CounterValue, float64(d.get(s)), name)
		}
	}
}

// dbCollector reads the due-rows gauge and River's job counts at scrape
// time, at most once per cacheFor however many scrapers ask.
type dbCollector struct {
	cfg      Config
	due      *prometheus.Desc
	outside  *prometheus.Desc
	riverJob *prometheus.Desc
	up       *prometheus.Desc

	mu      sync.Mutex
	last    time.Time
	metrics []prometheus.Metric
}

const cacheFor = 5 * time.Second

func newDBCollector(cfg Config) *dbCollector {
	return &dbCollector{
		cfg: cfg,
		due: prometheus.NewDesc(namespace+"_due_rows", "Rows due for a reconciler that pass this fleet's tenant filter (counted up to a cap).",
			[]string{"reconciler"}, nil),
		outside: prometheus.NewDesc(namespace+"_due_rows_outside_filter", "Due rows this fleet's tenant filter leaves to other fleets (skipped by filter).",
			[]string{"reconciler"}, nil),
		riverJob: prometheus.NewDesc(namespace+"_river_jobs", "River jobs of this fleet's kinds, by kind and state.",
			[]string{"kind", "state"}, nil),
		up: prometheus.NewDesc(namespace+"_database_up", "1 when the last scrape could read the database.", nil, nil),
	}
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.due
	ch <- c.outside
	ch <- c.riverJob
	ch <- c.up
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.last) > cacheFor {
		c.metrics = c.read()
		c.last = time.Now()
	}
	for _, m := range c.metrics {
		ch <- m
	}
}

// readTimeout bounds each of a scrape's reads (one per reconciler, one of
// River's jobs) rather than the scrape as a whole, so that a slow database
// makes a scrape slower but does not starve the reads that come last: ten
// reconcilers' counts sharing one budget once left the River job gauge
// empty on a loaded server.
const readTimeout = 3 * time.Second

func (c *dbCollector) read() []prometheus.Metric {
	var out []prometheus.Metric
	up := 1.0
	now := store.NowMs()
	for _, r := range workers.All() {
		if r.Retained && c.cfg.Retention <= 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		dc, err := r.Due.Count(ctx, c.cfg.Pool, r.DueAt(now, workers.Config{Retention: c.cfg.Retention, DependencyStaleThreshold: c.cfg.DependencyStaleThreshold}), c.cfg.Filter, c.cfg.DueCap)
		cancel()
		if err != nil {
			c.cfg.Logger.Warn("metrics: count due rows", "reconciler", r.Name, "error", err)
			up = 0
			continue
		}
		out = append(out, prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(dc.Due), r.Name))
		if !c.cfg.Filter.Empty() {
			out = append(out, prometheus.MustNewConstMetric(c.outside, prometheus.GaugeValue, float64(dc.OutsideFilter), r.Name))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	rows, err := c.cfg.Pool.Query(ctx, `SELECT kind, state::text, count(*) FROM `+
		pgx.Identifier{c.cfg.RiverSchema, "river_job"}.Sanitize()+` WHERE kind LIKE 'ff.%' GROUP BY 1, 2`)
	if err == nil {
		for rows.Next() {
			var kind, state string
			var n int64
			if err = rows.Scan(&kind, &state, &n); err != nil {
				break
			}
			out = append(out, prometheus.MustNewConstMetric(c.riverJob, prometheus.GaugeValue, float64(n), kind, state))
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		c.cfg.Logger.Warn("metrics: count River jobs", "error", err)
		up = 0
	}
	return append(out, prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up))
}
