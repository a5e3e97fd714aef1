package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/tracing"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// runConfig is everything `worker run` is configured with.
type runConfig struct {
	fleet           fleet.Config
	httpAddr        string
	shutdownTimeout time.Duration
	ui              bool
	uiUser          string
	uiPassword      string // never logged
	uiReadOnly      bool
}

func parseRunFlags(args []string, stdout io.Writer) (*runConfig, error) {
	var (
		rc          runConfig
		reconcilers []string
		instanceTag string
		uiAuth      string
		intervals   = map[string]*time.Duration{}
	)
	fc := &rc.fleet
	f := newFlagSet("run", "Run the FlowFabric reconcilers as River workers. Serves River UI at /riverui/, /healthz, /readyz and /stats.\nRun as many identical processes as you like against one database: River elects one leader to tick.\n"+
		"A value means what it says: 0 turns off the settings that can be off (--retention, --outbox-retention, --lookahead,\n"+
		"--dependency-stale-threshold) and is refused for the others; negative values are refused; an unset flag takes its default.")
	databaseURLFlag(f, &fc.DatabaseURL)
	f.String(&fc.RiverSchema, "river-schema", "FF_RIVER_SCHEMA", jobs.DefaultRiverSchema, "Postgres schema holding River's tables")
	f.String(&rc.httpAddr, "http-addr", "FF_HTTP_ADDR", "127.0.0.1:8080", "address for River UI and health endpoints (empty disables HTTP)")
	f.Bool(&rc.ui, "ui", "FF_UI", true, "serve River UI at /riverui/")
	f.Secret(&uiAuth, "ui-auth", "FF_UI_AUTH", "protect River UI and its API with HTTP basic auth, given as USER:PASSWORD (never logged)")
	f.Bool(&rc.uiReadOnly, "ui-read-only", "FF_UI_READ_ONLY", false, "refuse every River UI API call that changes jobs or queues")
	f.Strings(&reconcilers, "reconcilers", "FF_RECONCILERS",
		"reconcilers to tick, repeatable or comma-separated: "+strings.Join(workers.Names(), ", ")+" (default all; retention only with --retention)")
	for _, r := range workers.All() {
		d := new(time.Duration)
		intervals[r.Name] = d
		f.Duration(d, intervalFlag(r), "FF_"+strings.ToUpper(r.Name)+"_INTERVAL", r.Interval,
			strings.ReplaceAll(r.Name, "_", " ")+" tick interval")
	}
	f.DurationText(&fc.Retention, "retention", "FF_RETENTION", "0: off", "delete terminal executions with all their rows once they ended this long ago, e.g. 24h")
	f.DurationText(&fc.OutboxRetention, "outbox-retention", "FF_OUTBOX_RETENTION", "0: off", "delete lease events, and dispatched completion events, older than this, e.g. 168h, every tenant's alike: refused with --namespace or --instance-tag")
	f.Duration(&fc.OutboxRetentionInterval, "outbox-retention-interval", "FF_OUTBOX_RETENTION_INTERVAL", workers.OutboxRetentionInterval, "outbox trim interval")
	f.Int(&fc.BatchSize, "batch-size", "FF_BATCH_SIZE", workers.DefaultBatchSize, "most due rows one partition scan enqueues (a full batch continues itself)")
	f.Int(&fc.PartitionCount, "partition-count", "FF_PARTITION_COUNT", jobs.PartitionCount, "flow partitions to scan, 0..N-1 (FlowFabric's num_flow_partitions)")
	f.Int(&fc.BudgetPartitionCount, "budget-partition-count", "FF_BUDGET_PARTITION_COUNT", workers.DefaultBudgetPartitionCount, "budget partitions budget_reset walks, 0..N-1 (FlowFabric's num_budget_partitions)")
	f.String(&fc.Filter.Namespace, "namespace", "FF_NAMESPACE", "", "only reconcile executions of this namespace (raw_fields.namespace)")
	f.String(&instanceTag, "instance-tag", "FF_INSTANCE_TAG", "", "only reconcile executions whose raw_fields.tags KEY is the string VALUE (a number or boolean tag never matches, as in FlowFabric), given as KEY=VALUE")
	f.Int(&fc.RowWorkers, "row-workers", "FF_ROW_WORKERS", fleet.DefaultRowWorkers, "row jobs River runs at once by this process (most wait for their row's statement)")
	f.Int(&fc.WorkConns, "work-conns", "FF_WORK_CONNS", fleet.DefaultWorkConns, "connections for row statements, scans and ticks")
	f.Int(&fc.RowBatch, "row-batch", "FF_ROW_BATCH", workers.DefaultRowBatch, "most row actions of one partition sharing one statement (1: one statement per row)")
	f.IntAuto(&fc.RowStatements, "row-statements", "FF_ROW_STATEMENTS", "2, or 1 with --synchronous-commit off", "most row-action statements of one reconciler in flight at once")
	f.String(&fc.SynchronousCommit, "synchronous-commit", "FF_SYNCHRONOUS_COMMIT", "on", "synchronous_commit of the reconcilers' own transactions (on, off, …); off trades crash durability for throughput (see docs/design.md)")
	f.String(&fc.RiverSynchronousCommit, "river-synchronous-commit", "FF_RIVER_SYNCHRONOUS_COMMIT", "off", "synchronous_commit of River's own bookkeeping (job fetch, completion, leadership): a state lost in a crash only re-runs a job")
	f.Duration(&fc.RowFetchCooldown, "row-fetch-cooldown", "FF_ROW_FETCH_COOLDOWN", fleet.DefaultRowFetchCooldown, "least time between two fetches of row jobs")
	f.Duration(&fc.DependencyStaleThreshold, "dependency-stale-threshold", "FF_DEPENDENCY_STALE_THRESHOLD", workers.DefaultDependencyStaleThreshold,
		"dependency dispatches completion events undispatched this long after their commit, as FlowFabric's supervisor does (0: at once, woken by FlowFabric's ff_completion notification: the fleet is the primary dispatcher)")
	f.Duration(&fc.Lookahead, "lookahead", "FF_LOOKAHEAD", fleet.DefaultLookahead, "deadline reconcilers enqueue rows falling due before their next tick plus this at once, to start at the deadline (0: only rows already due)")
	f.Duration(&fc.FetchPollInterval, "fetch-poll-interval", "FF_FETCH_POLL_INTERVAL", fleet.DefaultFetchPollInterval, "how often idle queues poll (the ticks', scans' and retention queues every 5 s at most); jobs waiting for their time are woken by the fleet itself, except with --poll-only")
	f.Duration(&fc.CompletedJobRetention, "completed-job-retention", "FF_COMPLETED_JOB_RETENTION", fleet.DefaultCompletedJobRetention, "how long completed jobs are kept for River UI")
	f.DurationText(&fc.ReindexInterval, "river-reindex-interval", "FF_RIVER_REINDEX_INTERVAL", "River's, daily at midnight UTC", "how often River rebuilds river_job's indexes, whose GIN indexes grow with every job inserted")
	f.Duration(&fc.RescueStuckJobsAfter, "rescue-stuck-jobs-after", "FF_RESCUE_STUCK_JOBS_AFTER", fleet.DefaultRescueStuckJobsAfter, "retry a job left running by a dead process after this")
	f.Duration(&rc.shutdownTimeout, "shutdown-timeout", "FF_SHUTDOWN_TIMEOUT", 10*time.Second, "on SIGINT/SIGTERM, how long running jobs may finish before they are cancelled")
	f.String(&fc.ClientID, "client-id", "FF_CLIENT_ID", "", "name of this process in River (default: derived from the host name)")
	f.Bool(&fc.Tracing, "otel", "FF_OTEL", false, "OpenTelemetry spans for River jobs and SQL, exported as the standard OTEL_* variables say (OTLP by default)")
	f.Bool(&fc.DisableJobLogs, "no-job-logs", "FF_NO_JOB_LOGS", false, "do not keep a per-job log line (shown in River UI) for row actions")
	f.Bool(&fc.PollOnly, "poll-only", "FF_POLL_ONLY", false, "poll instead of LISTEN/NOTIFY (behind a transaction-mode pooler)")
	f.Bool(&fc.DisableTakeover, "no-takeover", "FF_NO_TAKEOVER", false, "do not take over the leadership and running jobs of a fleet process that died without a clean stop (no connection of it left), nor start the ticks when a leadership changes hands; leave them to River's leadership TTL (15-21 s), rescuer (--rescue-stuck-jobs-after, then up to 30 s) and new leader (its periodic jobs start 0-6 s after its election)")
	if err := f.parse(args, stdout); err != nil {
		return nil, err
	}

	if instanceTag != "" {
		k, v, err := store.ParseInstanceTag(instanceTag)
		if err != nil {
			return nil, usageError{err}
		}
		fc.Filter.TagKey, fc.Filter.TagValue = k, v
	}
	if uiAuth != "" {
		u, p, ok := strings.Cut(uiAuth, ":")
		if !ok || u == "" || p == "" {
			return nil, badUsage("--ui-auth: want USER:PASSWORD with both parts non-empty")
		}
		rc.uiUser, rc.uiPassword = u, p
	}
	if len(reconcilers) == 0 {
		for _, r := range workers.DefaultOn(fc.Retention) {
			reconcilers = append(reconcilers, r.Name)
		}
	}
	// The command line's convention (--help, README "Settings"): a value
	// means what it says. 0 turns off the settings that can be off and is
	// refused for the others; negative values are refused. fleet.Config
	// reads zero as "the default" and negative as "off", so the values are
	// checked and translated here.
	for _, c := range []struct {
		flag string
		d    *time.Duration
	}{{"retention", &fc.Retention}, {"outbox-retention", &fc.OutboxRetention},
		{"lookahead", &fc.Lookahead}, {"dependency-stale-threshold", &fc.DependencyStaleThreshold}} {
		switch {
		case *c.d < 0:
			return nil, badUsage("--%s %s: must not be negative (0 turns it off)", c.flag, *c.d)
		case *c.d == 0 && c.flag != "retention" && c.flag != "outbox-retention":
			*c.d = -1 // fleet.Config's "off"
		}
	}
	positive := []struct {
		flag string
		d    time.Duration
	}{{"outbox-retention-interval", fc.OutboxRetentionInterval}, {"shutdown-timeout", rc.shutdownTimeout},
		{"row-fetch-cooldown", fc.RowFetchCooldown}, {"fetch-poll-interval", fc.FetchPollInterval},
		{"completed-job-retention", fc.CompletedJobRetention}, {"rescue-stuck-jobs-after", fc.RescueStuckJobsAfter}}
	if f.isSet("river-reindex-interval") {
		positive = append(positive, struct {
			flag string
			d    time.Duration
		}{"river-reindex-interval", fc.ReindexInterval})
	}
	for _, r := range workers.All() {
		positive = append(positive, struct {
			flag string
			d    time.Duration
		}{intervalFlag(r), *intervals[r.Name]})
	}
	for _, c := range positive {
		if c.d <= 0 {
			return nil, badUsage("--%s %s: must be positive", c.flag, c.d)
		}
	}
	counts := []struct {
		flag string
		v    int
	}{{"batch-size", fc.BatchSize}, {"partition-count", fc.PartitionCount}, {"budget-partition-count", fc.BudgetPartitionCount}, {"row-workers", fc.RowWorkers},
		{"work-conns", fc.WorkConns}, {"row-batch", fc.RowBatch}}
	if f.isSet("row-statements") {
		counts = append(counts, struct {
			flag string
			v    int
		}{"row-statements", fc.RowStatements})
	}
	for _, c := range counts {
		if c.v < 1 {
			return nil, badUsage("--%s %d: must be at least 1", c.flag, c.v)
		}
	}
	fc.Reconcilers = map[string]time.Duration{}
	for _, name := range reconcilers {
		r, ok := workers.ByName(name)
		if !ok {
			return nil, badUsage("--reconcilers: unknown reconciler %q (known: %s)", name, strings.Join(workers.Names(), ", "))
		}
		if r.Retained && fc.Retention == 0 {
			return nil, badUsage("--reconcilers %s: needs a retention (--retention, e.g. 24h): how long an execution stays after it ends", name)
		}
		fc.Reconcilers[name] = *intervals[name]
	}
	if fc.DatabaseURL == "" {
		fc.DatabaseURL = dbconn.DefaultURL
	}
	if err := dbconn.Validate(fc.DatabaseURL); err != nil {
		return nil, usageError{err}
	}
	if err := fc.Validate(); err != nil {
		return nil, usageError{flagError(err, intervals)}
	}
	return &rc, nil
}

func runCommand(ctx context.Context, args []string, stdout, _ io.Writer, logger *slog.Logger) error {
	rc, err := parseRunFlags(args, stdout)
	if err != nil {
		return err
	}
	return run(ctx, rc, logger, nil)
}

// run runs one worker process until ctx is cancelled. When started is not
// nil it receives the HTTP address once the process is ready (for tests).
func run(ctx context.Context, rc *runConfig, logger *slog.Logger, started chan<- string) error {
	fc := rc.fleet
	fc.Logger = logger
	logger.Info("starting worker", "database", dbconn.Redact(fc.DatabaseURL), "river_schema", fc.RiverSchema,
		"reconcilers", enabledList(fc.Reconcilers), "retention", fc.Retention, "outbox_retention", fc.OutboxRetention, "namespace", fc.Filter.Namespace,
		"instance_tag_key", fc.Filter.TagKey, "http_addr", rc.httpAddr,
		"ui", rc.ui, "ui_auth", rc.uiUser != "", "ui_read_only", rc.uiReadOnly)
	if names := workers.AllTenantsOf(fc.WithDefaults().Reconcilers); !fc.Filter.Empty() && len(names) > 0 {
		logger.Warn(allTenantsNotice, "filter", fc.Filter.String(), "reconcilers", strings.Join(names, ","))
	}
	if rc.httpAddr != "" && rc.ui && rc.uiUser == "" && !isLoopback(rc.httpAddr) {
		logger.Warn("River UI is served without authentication on a non-loopback address; anyone who reaches it can cancel, delete and retry jobs (set --ui-auth or --ui-read-only)",
			"http_addr", rc.httpAddr)
	}

	if fc.Tracing {
		shutdown, err := tracing.Setup(ctx, "ffreconcile-worker")
		if err != nil {
			return err
		}
		defer func() {
			flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(flushCtx); err != nil {
				logger.Warn("flush OpenTelemetry spans", "error", err)
			}
		}()
	}
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return err
	}
	defer f.Close()

	var ready atomic.Bool
	var srv *http.Server
	var addr string
	if rc.httpAddr != "" {
		handler, err := newHTTPHandler(ctx, f, rc, logger, &ready)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", rc.httpAddr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", rc.httpAddr, err)
		}
		addr = ln.Addr().String()
		srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("http server stopped", "error", err)
			}
		}()
	}

	if err := f.Start(ctx); err != nil {
		var mismatch *fleet.ConfigMismatchError
		if errors.As(err, &mismatch) {
			return err
		}
		return fmt.Errorf("start: %w", dbconn.Scrub(err, fc.DatabaseURL))
	}
	ready.Store(true)
	logger.Info("worker running", "http_addr", addr, "river_ui", uiURL(addr, rc.ui))
	if started != nil {
		started <- addr
	}

	<-ctx.Done()
	ready.Store(false)
	logger.Info("shutting down: no new jobs; waiting for running jobs", "timeout", rc.shutdownTimeout)
	stopCtx, cancel := context.WithTimeout(context.Background(), rc.shutdownTimeout)
	defer cancel()
	stopErr := f.Stop(stopCtx)
	if srv != nil {
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutCtx)
	}
	if stopErr != nil {
		return stopErr
	}
	logger.Info("worker stopped")
	return nil
}

// allTenantsNotice is the line a filtered `worker run` logs at start when
// it runs reconcilers whose rows belong to no tenant
// (workers.Reconciler.AllTenants).
const allTenantsNotice = "the tenant filter does not apply to these reconcilers: their rows belong to no tenant, " +
	"so they act on every tenant's rows, as in FlowFabric; run them in one fleet only (leave them out of the others with --reconcilers)"

func enabledList(m map[string]time.Duration) string {
	var parts []string
	for _, r := range workers.All() {
		if d, ok := m[r.Name]; ok {
			parts = append(parts, r.Name+"="+d.String())
		}
	}
	return strings.Join(parts, ",")
}

// intervalFlag is the name of r's interval flag, e.g. lease-expiry-interval.
// configFlags are the flags of fleet.Config's fields, for flagError.
var configFlags = map[string]string{
	"RiverSchema": "river-schema", "BatchSize": "batch-size", "PartitionCount": "partition-count",
	"BudgetPartitionCount": "budget-partition-count", "RowBatch": "row-batch", "RowStatements": "row-statements",
	"RowWorkers": "row-workers", "WorkConns": "work-conns", "SynchronousCommit": "synchronous-commit",
	"RiverSynchronousCommit": "river-synchronous-commit", "RowFetchCooldown": "row-fetch-cooldown",
	"FetchPollInterval": "fetch-poll-interval", "Lookahead": "lookahead", "ReindexInterval": "river-reindex-interval",
	"CompletedJobRetention": "completed-job-retention", "RescueStuckJobsAfter": "rescue-stuck-jobs-after",
	"Filter.TagValue": "instance-tag", "Retention": "retention", "OutboxRetention": "outbox-retention",
	"OutboxRetentionInterval": "outbox-retention-interval",
}

// flagError words a fleet.ConfigError, which names a Go field, under the
// field's flag, as the user gave it; other errors are returned as they are.
func flagError(err error, intervals map[string]*time.Duration) error {
	var ce *fleet.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	flagName, ok := configFlags[ce.Field]
	if name, isInterval := strings.CutPrefix(ce.Field, "Reconcilers["); isInterval {
		if r, known := workers.ByName(strings.TrimSuffix(name, "]")); known {
			flagName, ok = intervalFlag(r), true
		}
	}
	if !ok {
		return err
	}
	// Problems word the Go fields' conventions ("negative turns it off",
	// "0 keeps River's…"); the flags' are in --help.
	problem := ce.Problem
	for _, goOnly := range []string{"; negative turns it off)", "; 0 keeps River's daily reindex)"} {
		problem = strings.Replace(problem, goOnly, ")", 1)
	}
	return fmt.Errorf("--%s %s: %s", flagName, ce.Value, problem)
}

func intervalFlag(r *workers.Reconciler) string {
	return strings.ReplaceAll(r.Name, "_", "-") + "-interval"
}

func uiURL(addr string, ui bool) string {
	if addr == "" || !ui {
		return ""
	}
	return "http://" + addr + "/riverui/"
}

// isLoopback reports whether addr (host:port) listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
