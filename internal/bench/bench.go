// Package bench measures the fleet against the seed's design on a throwaway
// database: throughput, lateness, idle cost and scale (issue 5). `worker
// bench` runs it; `make bench` writes docs/benchmarks.md.
//
// Every comparison is a ratio measured in the same run: absolute times on a
// shared 2-core machine drift by ±25 %.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// Config sizes the benchmark.
type Config struct {
	// AdminURL is a server's maintenance database; the benchmark creates
	// (and at the end drops) its own database DBName there.
	AdminURL string
	DBName   string

	Due int // due rows per throughput run (default 20,000)
	// DependencyEvents is the number of completion events the dependency
	// section dispatches per design (default 5,000: FlowFabric's loop
	// takes a minute or more for them).
	DependencyEvents int
	// FinishedFlows is the number of finished flows (three members each)
	// the flows section projects, then keeps beside an idle fleet
	// (default 100,000).
	FinishedFlows int
	// BacklogMembers is the number of cancel backlog members (ten per
	// flow) the backlog section drains (default 20,000).
	BacklogMembers int
	NotDueFactor   int   // not-due rows per due row (default 10)
	PoolSizes      []int // connection counts for the per-row pool reference

	LatenessRate int // due rows per second in the lateness runs
	// PrimaryRate is the completion events per second fed to the
	// dependency section's primary dispatcher (default 1,000, issue 51's).
	PrimaryRate int
	LatenessFor time.Duration // duration of each lateness run
	// LatenessLeads: how long before its deadline each row of a lateness
	// stream is inserted; every sweep stream runs once per lead (default
	// 1 s, a row that appears after the tick before its deadline and is
	// found by the tick after it, and 10 s, a row that exists before the
	// tick ahead of its deadline, as a lease renewed every few seconds or
	// a suspension with a timeout in minutes).
	LatenessLeads []time.Duration

	IdleFor time.Duration // idle-cost measuring window

	ScaleSmall, ScaleLarge int // not-due rows in the scale runs
	Backlog                int // rows in the backlog drain run
	// RetentionBacklog is the number of expired terminal executions the
	// retention section trims (default 1,000,000).
	RetentionBacklog int

	// PromoteFor is the length of each run of the promote section, and
	// PromoteConns its connections, each enqueueing one promotion per
	// transaction (defaults 10 s and 8).
	PromoteFor   time.Duration
	PromoteConns int

	// CommitModes are the synchronous_commit settings the throughput runs
	// compare (every design runs under each; default on and off).
	CommitModes []string

	// Fleet is the base configuration of every process of ours the
	// benchmark starts (its zero value is the fleet's defaults); the
	// database, logger and per-run settings are filled in by each run.
	Fleet fleet.Config

	// CPUProfile, when set, is a path prefix: each throughput run of ours
	// writes a Go CPU profile to <prefix>-<reconciler>-<commit>.pprof, each
	// lateness run to <prefix>-lateness-<reconciler>.pprof.
	CPUProfile string

	// WorkerBinary is the `worker` executable the failover section starts
	// its fleet of real processes with (cmd/worker passes its own).
	WorkerBinary string

	// Sections limits the run to some of SectionNames.
	Sections []string
	// OursOnly skips the reference designs in the throughput runs (for
	// tuning ours; the report then has no ratios).
	OursOnly bool
	// Reconcilers limits throughput and lateness to some reconcilers.
	Reconcilers []string

	Logger *slog.Logger
	Out    io.Writer // progress lines
}

// Defaults returns the sizes.
func Defaults() Config {
	return Config{
		DBName: "ffr_bench", Due: 20_000, NotDueFactor: 10, PoolSizes: []int{8, 32},
		CommitModes:  []string{"on", "off"},
		LatenessRate: 500, LatenessFor: 30 * time.Second, IdleFor: 20 * time.Second,
		LatenessLeads: []time.Duration{time.Second, 10 * time.Second},
		ScaleSmall:    10_000, ScaleLarge: 1_000_000, Backlog: 100_000,
		RetentionBacklog: 1_000_000,
		PromoteFor:       10 * time.Second, PromoteConns: 8,
		DependencyEvents: 5_000,
		PrimaryRate:      1_000,
		FinishedFlows:    100_000,
		BacklogMembers:   20_000,
	}
}

// SectionNames are the sections a run has, in the order they run.
var SectionNames = []string{"throughput", "lateness", "promote", "failover", "idle", "scale", "dependency", "retention", "flows", "backlog"}

// Quick returns sizes small enough for a smoke run.
func Quick() Config {
	c := Defaults()
	c.Due, c.NotDueFactor, c.PoolSizes = 2_000, 2, []int{8}
	c.DependencyEvents, c.PrimaryRate = 1_000, 100
	c.FinishedFlows = 5_000
	c.BacklogMembers = 2_000
	c.LatenessRate, c.LatenessFor, c.IdleFor = 100, 5*time.Second, 5*time.Second
	c.LatenessLeads = []time.Duration{time.Second}
	c.ScaleSmall, c.ScaleLarge, c.Backlog = 1_000, 20_000, 5_000
	c.RetentionBacklog = 20_000
	c.PromoteFor = 3 * time.Second
	return c
}

func (c *Config) wants(section string) bool {
	if len(c.Sections) == 0 {
		return true
	}
	for _, s := range c.Sections {
		if s == section {
			return true
		}
	}
	return false
}

func (c *Config) wantsReconciler(name string) bool {
	if len(c.Reconcilers) == 0 {
		return true
	}
	for _, s := range c.Reconcilers {
		if s == name {
			return true
		}
	}
	return false
}

// env is one benchmark database.
type env struct {
	cfg  Config
	url  string
	pool *pgxpool.Pool
	log  *slog.Logger
	// inserter is an insert-only River client, for ad-hoc promotions.
	inserter        *river.Client[pgx.Tx]
	promotedTrigger bool
	// commit is the synchronous_commit of the current throughput run, for
	// every design's connections ("" means the server's default).
	commit string
	// rowCosts has throughput runs also measure what a row job costs
	// besides its action: its job log and its GIN entries.
	rowCosts bool
	// noCheckpoint is set once CHECKPOINT was refused (see settle).
	noCheckpoint bool
	// server is the server's settings, read at setup, for the report.
	server store.ServerSettings
}

// fleetConfig is the configuration of one process of ours.
func (e *env) fleetConfig() fleet.Config {
	c := e.cfg.Fleet
	c.DatabaseURL, c.Logger = e.url, e.log
	return c
}

func withTracer(c fleet.Config, tr pgx.QueryTracer) fleet.Config { c.QueryTracer = tr; return c }

func withCommit(c fleet.Config, commit string) fleet.Config {
	if commit != "" {
		c.SynchronousCommit = commit
	}
	return c
}

// benchRaw is the raw_fields of the bench's executions and flows.
var benchRaw = json.RawMessage(`{"namespace": "bench"}`)

// benchTenantRaw is the raw_fields of the bench's executions of a tenant:
// namespace bench, instance tag bench-1.
var benchTenantRaw = json.RawMessage(`{"namespace": "bench", "tags": {"cairn.instance_id": "bench-1"}}`)

// seeded prints how long a section's seed rows took to write (their
// statements alone, before any VACUUM), to millisecond precision, so that
// seeding changes can be timed from the progress lines.
func (e *env) seeded(section string, start time.Time) {
	e.progress("%s: seed rows written in %s", section, time.Since(start).Round(time.Millisecond))
}

func (e *env) progress(format string, a ...any) {
	if e.cfg.Out != nil {
		fmt.Fprintf(e.cfg.Out, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
}

// Run runs the selected sections and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e, cleanup, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	rep := &Report{Config: cfg, Machine: machine(), Server: e.server, Started: time.Now()}
	if cfg.wants("throughput") {
		for _, mode := range cfg.CommitModes {
			e.commit = mode
			e.progress("throughput: River's ceiling, %d no-op row jobs (synchronous_commit %s)", cfg.Due, mode)
			ceiling, ceilingCPU, err := e.riverCeiling(ctx, cfg.Due, false)
			if err != nil {
				return rep, fmt.Errorf("River's ceiling (synchronous_commit %s): %w", mode, err)
			}
			e.progress("throughput: River's ceiling %.0f/s, CPU per job %s", ceiling, ceilingCPU)
			e.progress("throughput: River's ceiling with our row's args and job log, %d no-op row jobs", cfg.Due)
			shaped, shapedCPU, err := e.riverCeiling(ctx, cfg.Due, true)
			if err != nil {
				return rep, fmt.Errorf("River's ceiling with our row's args (synchronous_commit %s): %w", mode, err)
			}
			e.progress("throughput: River's ceiling with our row's args and job log %.0f/s, CPU per job %s", shaped, shapedCPU)
			if rep.RiverCeiling == nil {
				rep.RiverCeiling, rep.RiverCeilingCPU = map[string]float64{}, map[string]CPUCost{}
				rep.ShapedCeiling, rep.ShapedCeilingCPU = map[string]float64{}, map[string]CPUCost{}
			}
			rep.RiverCeiling[mode], rep.RiverCeilingCPU[mode] = ceiling, ceilingCPU
			rep.ShapedCeiling[mode], rep.ShapedCeilingCPU[mode] = shaped, shapedCPU
			// What a row job costs besides its action (the job log, the
			// GIN indexes) does not depend on the commit mode: measured
			// under the first.
			e.rowCosts = mode == cfg.CommitModes[0]
			if e.rowCosts {
				e.progress("throughput: %d no-op row jobs into river_job's GIN indexes", cfg.Due)
				if rep.CeilingGIN, err = e.riverCeilingGIN(ctx, cfg.Due); err != nil {
					return rep, fmt.Errorf("River's no-op jobs' GIN growth: %w", err)
				}
			}
			for _, sc := range scenarios() {
				if !cfg.wantsReconciler(sc.name) {
					continue
				}
				res, err := e.throughput(ctx, sc)
				if err != nil {
					return rep, fmt.Errorf("throughput %s (synchronous_commit %s): %w", sc.name, mode, err)
				}
				res.Commit = mode
				rep.Throughput = append(rep.Throughput, res)
			}
		}
		e.commit = ""
		if err := e.reset(ctx); err != nil {
			return rep, err
		}
	}
	if cfg.wants("lateness") {
		for _, lt := range latenessRuns() {
			if !cfg.wantsReconciler(lt.reconciler) {
				continue
			}
			leads := cfg.LatenessLeads
			if lt.oneLead {
				leads = leads[:1]
			}
			for _, lead := range leads {
				res, err := e.lateness(ctx, lt, lead)
				if err != nil {
					return rep, fmt.Errorf("lateness %s, lead %s: %w", lt.name, lead, err)
				}
				rep.Lateness = append(rep.Lateness, res)
			}
		}
	}
	if cfg.wants("promote") {
		res, err := e.promoteEnqueue(ctx)
		rep.Promote = res
		if err != nil {
			return rep, fmt.Errorf("promote: %w", err)
		}
	}
	if cfg.wants("failover") {
		res, err := e.failover(ctx)
		rep.Failover = res
		if err != nil {
			return rep, err
		}
	}
	if cfg.wants("idle") {
		res, err := e.idle(ctx)
		if err != nil {
			return rep, fmt.Errorf("idle: %w", err)
		}
		rep.Idle = res
	}
	if cfg.wants("scale") {
		res, err := e.scale(ctx)
		if err != nil {
			return rep, fmt.Errorf("scale: %w", err)
		}
		rep.Scale = res
	}
	if cfg.wants("dependency") {
		res, err := e.dependency(ctx)
		rep.Dependency = res
		if err != nil {
			return rep, fmt.Errorf("dependency: %w", err)
		}
	}
	if cfg.wants("retention") {
		res, err := e.retention(ctx)
		if err != nil {
			return rep, fmt.Errorf("retention: %w", err)
		}
		rep.Retention = res
	}
	if cfg.wants("flows") {
		res, err := e.flows(ctx)
		rep.Flows = res
		if err != nil {
			return rep, fmt.Errorf("flows: %w", err)
		}
	}
	if cfg.wants("backlog") {
		res, err := e.backlog(ctx)
		rep.Backlog = res
		if err != nil {
			return rep, fmt.Errorf("backlog: %w", err)
		}
	}
	rep.Finished = time.Now()
	return rep, nil
}

// setup migrates a template database once; every run then starts from a
// fresh copy of it (see reset).
func setup(ctx context.Context, cfg Config) (*env, func(), error) {
	tmpl := cfg.DBName + "_tmpl"
	e := &env{cfg: cfg, log: cfg.Logger}
	// Leftovers of an interrupted run go first.
	if err := adminExec(ctx, cfg.AdminURL,
		dropDatabase(cfg.DBName),
		dropDatabase(e.smallDBName()),
		dropDatabase(e.retentionTemplate()),
		dropDatabase(tmpl),
		"CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		return nil, nil, err
	}
	tmplURL, err := withDatabase(cfg.AdminURL, tmpl)
	if err != nil {
		return nil, nil, err
	}
	tpool, err := dbconn.Open(ctx, tmplURL, dbconn.Options{MaxConns: 2, AppName: "ffreconcile-bench"})
	if err != nil {
		return nil, nil, err
	}
	_, err = migrations.ApplyRiver(ctx, tpool, "river", nil)
	if err == nil {
		_, err = migrations.ApplyFF(ctx, tpool)
	}
	if err == nil {
		err = migrations.ApplyWorkerTable(ctx, tpool, "river")
	}
	if err == nil {
		_, err = migrations.ApplyObjects(ctx, tpool, "river")
	}
	tpool.Close()
	if err != nil {
		return nil, nil, err
	}
	url, err := withDatabase(cfg.AdminURL, cfg.DBName)
	if err != nil {
		return nil, nil, err
	}
	e.url = url
	// Server-wide settings: read through the admin URL, as the bench's
	// own database does not exist before reset.
	if e.server, err = readServer(ctx, cfg.AdminURL); err != nil {
		return nil, nil, err
	}
	cleanup := func() {
		e.close()
		_ = adminExec(context.Background(), cfg.AdminURL,
			dropDatabase(cfg.DBName),
			dropDatabase(tmpl))
	}
	if err := e.reset(ctx); err != nil {
		cleanup()
		return nil, nil, err
	}
	return e, cleanup, nil
}

func adminExec(ctx context.Context, adminURL string, stmts ...string) error {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", dbconn.Redact(adminURL), dbconn.Scrub(err, adminURL))
	}
	defer admin.Close(ctx)
	for _, s := range stmts {
		if _, err := admin.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// dropDatabase is the statement dropping database name if it exists,
// disconnecting its sessions (leftovers of an interrupted run included).
func dropDatabase(name string) string {
	return "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
}

// smallDBName is the database the scale section keeps its small table in
// while it loads the large one.
func (e *env) smallDBName() string { return e.cfg.DBName + "_small" }

// settle readies freshly loaded rows for a measurement: planner statistics
// (and, with vacuum, the visibility map and hint bits a long-lived table has),
// then a CHECKPOINT, so the measured design does not also pay for writing out
// the rows just loaded. A load is larger than a default shared_buffers
// (128 MB): without the checkpoint, backends evict its dirty pages themselves
// during the measurement, at a cost that depends on where the checkpointer
// happens to be, and the designs compared do not pay alike. A role that may
// not CHECKPOINT (PostgreSQL 15: superuser or pg_checkpoint) still gets its
// benchmark, with one warning.
func (e *env) settle(ctx context.Context, vacuum bool) error {
	stmt := "ANALYZE"
	if vacuum {
		stmt = "VACUUM ANALYZE"
	}
	if _, err := e.pool.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", strings.ToLower(stmt), err)
	}
	if e.noCheckpoint {
		return nil
	}
	if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" /* insufficient_privilege */ {
			e.noCheckpoint = true
			e.log.Warn("CHECKPOINT refused: measurements may include writing out the rows just loaded (grant pg_checkpoint to avoid it)", "error", err)
			return nil
		}
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
		e.pool = nil
	}
}

// reset replaces the benchmark database with a fresh copy of the template:
// faster than emptying 7 × 256 partitions, and it takes no relation locks
// (a TRUNCATE of a 256-way partitioned table takes ~1,000, which a busy
// server's lock table may not have).
func (e *env) reset(ctx context.Context) error {
	e.close()
	if err := adminExec(ctx, e.cfg.AdminURL,
		dropDatabase(e.cfg.DBName),
		"CREATE DATABASE "+pgx.Identifier{e.cfg.DBName}.Sanitize()+" TEMPLATE "+pgx.Identifier{e.cfg.DBName + "_tmpl"}.Sanitize()); err != nil {
		return err
	}
	return e.open(ctx)
}

// open connects the bench's pool and insert-only client to its database.
func (e *env) open(ctx context.Context) error {
	params := map[string]string{"plan_cache_mode": "force_custom_plan"}
	if e.commit != "" {
		params["synchronous_commit"] = e.commit
	}
	pool, err := dbconn.Open(ctx, e.url, dbconn.Options{MaxConns: 40, AppName: "ffreconcile-bench", RuntimeParams: params})
	if err != nil {
		return err
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "river", Logger: e.log})
	if err != nil {
		pool.Close()
		return err
	}
	e.pool, e.inserter, e.promotedTrigger = pool, inserter, false
	return nil
}

func withDatabase(base, name string) (string, error) {
	if strings.Contains(base, "://") {
		i := strings.LastIndex(base, "/")
		q := ""
		if j := strings.IndexByte(base[i:], '?'); j >= 0 {
			q = base[i+j:]
		}
		if i < strings.Index(base, "://")+3 {
			return base + "/" + name + q, nil
		}
		return base[:i] + "/" + name + q, nil
	}
	return base + " dbname=" + name, nil
}

// Machine describes where the numbers were taken.
func Machine() string { return machine() }

// machine describes where the numbers were taken.
func machine() string {
	host, _ := os.Hostname()
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				if _, v, ok := strings.Cut(line, ":"); ok {
					model = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores (%s), %s/%s, %s", host, runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// waitDrained polls remaining() until it returns 0 and returns when it saw
// that, or fails after timeout.
func waitDrained(ctx context.Context, timeout time.Duration, remaining func(context.Context) (int, error)) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := remaining(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if n == 0 {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("still %d rows due after %s", n, timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		// Each poll is a whole-table count (~1,000 locks): keep it rare.
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// scenarios lists the throughput benchmarks.
func scenarios() []scenario {
	return []scenario{leaseScenario, suspensionScenario, promotionScenario, attemptScenario}
}

// latenessRuns lists the lateness benchmarks.
func latenessRuns() []latenessRun {
	return []latenessRun{leaseLateness, suspensionLateness, promotionLateness, adhocLateness, adhocSQLLateness, attemptLateness}
}

// readServer reads the settings of the server of url.
func readServer(ctx context.Context, url string) (store.ServerSettings, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return store.ServerSettings{}, fmt.Errorf("connect to %s: %w", dbconn.Redact(url), dbconn.Scrub(err, url))
	}
	defer conn.Close(ctx)
	return store.ReadServerSettings(ctx, conn)
}

// ServerLine describes the server's settings that bear on the results, as a
// sentence of the reports.
func ServerLine(s store.ServerSettings) string {
	av := "on"
	if !s.Autovacuum {
		av = "**off**"
	}
	return fmt.Sprintf("Server: PostgreSQL %s, autovacuum %s, max_locks_per_transaction %d.", s.Version, av, s.MaxLocksPerTransaction)
}

// drainWith starts a fleet of cfg and waits until left reports nothing
// left (10 minutes at most), then stops it: how long that took from the
// fleet's start (its election and first tick included), the CPU it cost
// per row of rows, and reconciler r's counters.
func (e *env) drainWith(ctx context.Context, cfg fleet.Config, r *workers.Reconciler, rows int,
	left func(context.Context) (int, error)) (time.Duration, CPUCost, string, error) {
	f, err := fleet.New(ctx, cfg)
	if err != nil {
		return 0, CPUCost{}, "", err
	}
	cpu := sampleCPU()
	start := time.Now()
	if err := f.Start(ctx); err != nil {
		f.Close()
		return 0, CPUCost{}, "", err
	}
	done, err := waitDrained(ctx, 10*time.Minute, left)
	took, cost := done.Sub(start), cpu.per(rows)
	stats := statsLine(f.Workers.Stats().For(r.Name).Snapshot(), nil)
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_ = f.Stop(stopCtx)
	cancel()
	f.Close()
	return took, cost, stats, err
}
