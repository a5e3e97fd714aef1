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
		uiAuth      string
		intervals   = map[string]*time.Duration{}
	)
	fc := &rc.fleet
	f := newFlagSet("run", "Run the FlowFabric reconcilers as River workers. Serves River UI at /riverui/, /healthz, /readyz and /stats.\nRun as many identical processes as you like against one database: River elects one leader to tick.\n"+
		"A value means what it says: 0 turns off the settings that can be off (--retention, --outbox-retention, --lookahead,\n"+
		"--dependency-stale-threshold, …) and is refused for the others; negative values are refused; an unset flag takes its default.")
	f.settings(fc.Flags())
	f.String(&rc.httpAddr, "http-addr", "FF_HTTP_ADDR", "127.0.0.1:8080", "address for River UI and health endpoints (empty disables HTTP)")
	f.Bool(&rc.ui, "ui", "FF_UI", true, "serve River UI at /riverui/")
	f.Secret(&uiAuth, "ui-auth", "FF_UI_AUTH", "protect River UI and its API with HTTP basic auth, given as USER:PASSWORD (never logged)")
	f.Bool(&rc.uiReadOnly, "ui-read-only", "FF_UI_READ_ONLY", false, "refuse every River UI API call that changes jobs or queues")
	f.Strings(&reconcilers, "reconcilers", "FF_RECONCILERS",
		"reconcilers to tick, repeatable or comma-separated: "+strings.Join(workers.Names(), ", ")+
			" (default all, but those a setting turns on only with it: "+strings.Join(onlyWith(), ", ")+")")
	for _, r := range workers.All() {
		intervals[r.Name] = new(time.Duration)
		f.positiveDuration(intervals[r.Name], r.IntervalFlag(), r.Interval.String(), strings.ReplaceAll(r.Name, "_", " ")+" tick interval")
	}
	f.positiveDuration(&rc.shutdownTimeout, "shutdown-timeout", "10s", "on SIGINT/SIGTERM, how long running jobs may finish before they are cancelled")
	if err := f.parse(args, stdout); err != nil {
		return nil, err
	}
	if rc.shutdownTimeout == 0 {
		rc.shutdownTimeout = 10 * time.Second
	}
	if uiAuth != "" {
		u, p, ok := strings.Cut(uiAuth, ":")
		if !ok || u == "" || p == "" {
			return nil, badUsage("--ui-auth: want USER:PASSWORD with both parts non-empty")
		}
		rc.uiUser, rc.uiPassword = u, p
	}
	if len(reconcilers) == 0 {
		for _, r := range workers.DefaultOn(fc.Settings) {
			reconcilers = append(reconcilers, r.Name)
		}
	}
	fc.Reconcilers = map[string]time.Duration{}
	for _, name := range reconcilers {
		var interval time.Duration
		if p, ok := intervals[name]; ok {
			interval = *p
		}
		fc.Reconcilers[name] = interval
	}
	if err := fc.Validate(); err != nil {
		return nil, usageError{err}
	}
	return &rc, nil
}

// onlyWith names each reconciler turned on by a setting, with the flag.
func onlyWith() []string {
	var out []string
	for _, r := range workers.All() {
		if r.OnlyWith != nil {
			out = append(out, r.Name+" with --"+r.OnlyWith.Flag)
		}
	}
	return out
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
		"reconcilers", enabledList(fc.WithDefaults().Reconcilers), "settings", settingsList(fc.Settings), "namespace", fc.Filter.Namespace,
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
	if ui := uiURL(addr, rc.ui); ui != "" {
		// The row jobs, what a person opens, are lost among the ticks and
		// scans in River UI's unfiltered list.
		logger.Info("worker running", "http_addr", addr, "river_ui", ui, "river_ui_row_jobs", ui+"jobs?state=completed&queue="+jobs.QueueRows)
	} else {
		logger.Info("worker running", "http_addr", addr)
	}
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

// settingsList shows the reconcilers' settings that are set.
func settingsList(v workers.Values) string {
	var parts []string
	for _, s := range workers.AllSettings() {
		if d, ok := v[s]; ok && d != 0 {
			val := d.String()
			if d == workers.Off {
				val = "off" // 0 on the command line; -1ns inside
			}
			parts = append(parts, s.Flag+"="+val)
		}
	}
	return strings.Join(parts, ",")
}

func enabledList(m map[string]time.Duration) string {
	var parts []string
	for _, r := range workers.All() {
		if d, ok := m[r.Name]; ok {
			parts = append(parts, r.Name+"="+d.String())
		}
	}
	return strings.Join(parts, ",")
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
