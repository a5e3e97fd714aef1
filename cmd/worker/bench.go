package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/flowfabric/ffreconcile/internal/bench"
	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/workers"
)

func benchCommand(ctx context.Context, args []string, stdout, _ io.Writer, logger *slog.Logger) error {
	cfg := bench.Defaults()
	var dsn, out string
	var quick bool
	var sections, reconcilers []string
	f := newFlagSet("bench", "Benchmark the fleet against the seed's design on a throwaway database (created in the server\nof --database-url and dropped at the end): every section of --section below, or those named. Prints a table and,\nwith --out, writes it as Markdown.")
	databaseURLFlag(f, &dsn)
	f.String(&cfg.DBName, "bench-database", "FF_BENCH_DATABASE", cfg.DBName, "name of the throwaway database (dropped first if it exists)")
	f.String(&out, "out", "FF_BENCH_OUT", "", "write the Markdown report to this file (e.g. docs/benchmarks.md)")
	f.Bool(&quick, "quick", "FF_BENCH_QUICK", false, "small sizes for a smoke run (sizes below are then ignored)")
	f.Strings(&sections, "section", "FF_BENCH_SECTIONS", "run only these sections: "+strings.Join(bench.SectionNames, ", ")+" (repeatable)")
	f.Strings(&reconcilers, "reconciler", "FF_BENCH_RECONCILERS", "limit throughput and lateness to these reconcilers (repeatable)")
	f.Int(&cfg.Due, "due", "FF_BENCH_DUE", cfg.Due, "due rows per throughput run")
	f.Int(&cfg.DependencyEvents, "dependency-events", "FF_BENCH_DEPENDENCY_EVENTS", cfg.DependencyEvents, "completion events the dependency section dispatches per design")
	f.Int(&cfg.NotDueFactor, "not-due-factor", "FF_BENCH_NOT_DUE_FACTOR", cfg.NotDueFactor, "not-due rows per due row")
	f.Int(&cfg.LatenessRate, "lateness-rate", "FF_BENCH_LATENESS_RATE", cfg.LatenessRate, "rows becoming due per second in lateness runs")
	f.Int(&cfg.PrimaryRate, "primary-rate", "FF_BENCH_PRIMARY_RATE", cfg.PrimaryRate, "completion events per second fed to the dependency section's primary dispatcher")
	f.Duration(&cfg.LatenessFor, "lateness-for", "FF_BENCH_LATENESS_FOR", cfg.LatenessFor, "length of each lateness run")
	var leads []string
	f.Strings(&leads, "lateness-lead", "FF_BENCH_LATENESS_LEAD", "how long before its deadline each lateness row is inserted; each sweep stream runs once per lead (repeatable; default 1s and 10s)")
	f.Duration(&cfg.IdleFor, "idle-for", "FF_BENCH_IDLE_FOR", cfg.IdleFor, "idle-cost measuring window")
	f.Int(&cfg.ScaleLarge, "scale-large", "FF_BENCH_SCALE_LARGE", cfg.ScaleLarge, "not-due rows in the large scale run")
	f.Int(&cfg.Backlog, "backlog", "FF_BENCH_BACKLOG", cfg.Backlog, "expired leases in the scale section's backlog drain (the backlog section's size is --backlog-members)")
	f.Int(&cfg.BacklogMembers, "backlog-members", "FF_BENCH_BACKLOG_MEMBERS", cfg.BacklogMembers, "cancel backlog members (ten per flow) the backlog section drains")
	f.Int(&cfg.FinishedFlows, "finished-flows", "FF_BENCH_FINISHED_FLOWS", cfg.FinishedFlows, "finished flows (three members each) the flows section projects")
	f.Int(&cfg.Fleet.RowWorkers, "row-workers", "FF_ROW_WORKERS", fleet.DefaultRowWorkers, "ours: row actions run at once")
	f.Int(&cfg.Fleet.WorkConns, "work-conns", "FF_WORK_CONNS", fleet.DefaultWorkConns, "ours: work-pool connections")
	f.Int(&cfg.Fleet.DispatchLanes, "dispatch-lanes", "FF_DISPATCH_LANES", fleet.DefaultDispatchLanes, "ours: single-event dependency dispatch connections (0: none, as `worker run --dispatch-lanes 0`)")
	f.Duration(&cfg.Fleet.RowFetchCooldown, "row-fetch-cooldown", "FF_ROW_FETCH_COOLDOWN", fleet.DefaultRowFetchCooldown, "ours: least time between two fetches of row jobs")
	f.Duration(&cfg.Fleet.Lookahead, "lookahead", "FF_LOOKAHEAD", fleet.DefaultLookahead, "ours: deadline reconcilers enqueue rows falling due before their next tick plus this at once, to start at the deadline (0: off)")
	f.Int(&cfg.Fleet.RowBatch, "row-batch", "FF_ROW_BATCH", workers.DefaultRowBatch, "ours: most row actions of one partition sharing one statement")
	f.IntAuto(&cfg.Fleet.RowStatements, "row-statements", "FF_ROW_STATEMENTS", "2, or 1 under synchronous_commit off", "ours: most row-action statements of one reconciler in flight")
	f.Bool(&cfg.Fleet.DisableJobLogs, "no-job-logs", "FF_NO_JOB_LOGS", false, "ours: no per-job log line (River UI) for row actions")
	f.Bool(&cfg.OursOnly, "ours-only", "FF_BENCH_OURS_ONLY", false, "throughput: run only ours, not the reference designs; dependency: leave out FlowFabric's loop (minutes) (for tuning)")
	var (
		soak, soakWindow time.Duration
		soakRate         int
	)
	f.Duration(&soak, "soak", "FF_BENCH_SOAK", 0, "instead of the sections: soak for this long (e.g. 30m), the demo's mixed stream into one fleet process, reported per --soak-window")
	f.Int(&soakRate, "soak-rate", "FF_BENCH_SOAK_RATE", bench.DefaultSoakRate, "soak: demo items fed per second (default about half the mixed stream's maximum on 2 cores)")
	f.Duration(&soakWindow, "soak-window", "FF_BENCH_SOAK_WINDOW", 5*time.Minute, "soak: length of each reported window")
	var commits []string
	f.Strings(&commits, "commit", "FF_BENCH_COMMIT", "synchronous_commit settings the throughput runs compare: on, off (repeatable; default both)")
	f.String(&cfg.CPUProfile, "cpu-profile", "FF_BENCH_CPU_PROFILE", "", "write a Go CPU profile of each throughput run of ours to <prefix>-<reconciler>-<commit>.pprof and of each lateness run to <prefix>-lateness-<reconciler>.pprof")
	if err := f.parse(args, stdout); err != nil {
		return err
	}
	// As `worker run`: 0 turns the lookahead off (fleet.Config's negative).
	switch {
	case cfg.Fleet.Lookahead < 0:
		return badUsage("--lookahead %s: must not be negative (0 turns it off)", cfg.Fleet.Lookahead)
	case cfg.Fleet.Lookahead == 0:
		cfg.Fleet.Lookahead = -1
	}
	if quick {
		q := bench.Quick()
		q.DBName, q.Fleet, q.OursOnly = cfg.DBName, cfg.Fleet, cfg.OursOnly
		cfg = q
	}
	for _, part := range sections {
		if !slices.Contains(bench.SectionNames, part) {
			return badUsage("unknown section %q (want one of %s)", part, strings.Join(bench.SectionNames, ", "))
		}
		cfg.Sections = append(cfg.Sections, part)
	}
	if len(commits) > 0 {
		cfg.CommitModes = nil
		for _, part := range commits {
			if part != "on" && part != "off" {
				return badUsage("unknown --commit %q (want on or off)", part)
			}
			cfg.CommitModes = append(cfg.CommitModes, part)
		}
	}
	if len(leads) > 0 {
		cfg.LatenessLeads = nil
		for _, part := range leads {
			d, err := time.ParseDuration(part)
			if err != nil || d <= 0 || d > time.Minute {
				return badUsage("bad --lateness-lead %q (want a duration above 0 and at most 1m, e.g. 1s)", part)
			}
			cfg.LatenessLeads = append(cfg.LatenessLeads, d)
		}
	}
	for _, name := range reconcilers {
		if _, ok := workers.ByName(name); !ok {
			return badUsage("unknown reconciler %q (known: %s)", name, strings.Join(workers.Names(), ", "))
		}
		cfg.Reconcilers = append(cfg.Reconcilers, name)
	}
	if cfg.Due < 256 || cfg.DependencyEvents < 1 || cfg.NotDueFactor < 0 || cfg.LatenessRate < 10 || cfg.PrimaryRate < 10 || cfg.LatenessFor <= 0 || cfg.IdleFor <= 0 {
		return badUsage("sizes out of range: --due ≥ 256, --dependency-events ≥ 1, --not-due-factor ≥ 0, --lateness-rate ≥ 10, --primary-rate ≥ 10, durations > 0")
	}
	switch {
	case cfg.Fleet.DispatchLanes < 0:
		return badUsage("--dispatch-lanes %d: must not be negative (0 turns the lanes off)", cfg.Fleet.DispatchLanes)
	case cfg.Fleet.DispatchLanes == 0:
		cfg.Fleet.DispatchLanes = -1 // fleet.Config's none; its 0 is the default
	}
	if dsn == "" {
		dsn = dbconn.DefaultAdminURL
	}
	cfg.AdminURL = dsn
	cfg.Logger = logger
	// The failover section runs this very binary as its fleet's processes.
	if exe, err := os.Executable(); err == nil {
		cfg.WorkerBinary = exe
	}
	cfg.Out = stdout
	if soak != 0 {
		if soak < 0 || soakWindow <= 0 || soakWindow > soak || soakRate < 1 || soakRate > 10_000 {
			return badUsage("soak out of range: --soak > 0, 0 < --soak-window ≤ --soak, --soak-rate in 1..10000")
		}
		started := time.Now()
		res, err := bench.Soak(ctx, cfg, soakRate, soak, soakWindow)
		if err != nil {
			return dbconn.Scrub(err, dsn)
		}
		md := res.Markdown("worker bench "+strings.Join(args, " "), bench.Machine(), started)
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, md)
		if out != "" {
			// The soak is a section of the benchmark report: it replaces
			// the file's previous soak section and keeps the rest.
			old, err := os.ReadFile(out)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("read %s: %w", out, err)
			}
			if err := os.WriteFile(out, []byte(bench.SpliceSoak(string(old), md)), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
			fmt.Fprintf(stdout, "\nwrote the soak section of %s\n", out)
		}
		return nil
	}
	// A new report keeps the soak section of the one it replaces (the soak
	// runs on its own, `make soak`).
	var keepSoak string
	if out != "" {
		if old, err := os.ReadFile(out); err == nil {
			keepSoak = bench.SoakSection(string(old))
		}
	}
	withSoak := func(md string) string {
		if keepSoak == "" {
			return md
		}
		return bench.SpliceSoak(md, keepSoak)
	}
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		rep.Command = "worker bench " + strings.Join(args, " ")
	}
	if err != nil {
		// What was measured before the failure is kept, marked incomplete:
		// a late section failing must not lose half an hour of numbers.
		if rep != nil && out != "" {
			md := withSoak(rep.Markdown() + "\n**Incomplete run**: " + dbconn.Scrub(err, dsn).Error() + "\n")
			if werr := os.WriteFile(out, []byte(md), 0o644); werr == nil {
				fmt.Fprintf(stdout, "\nwrote the sections measured before the failure to %s\n", out)
			}
		}
		return dbconn.Scrub(err, dsn)
	}
	md := rep.Markdown()
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, md)
	if out != "" {
		if err := os.WriteFile(out, []byte(withSoak(md)), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", out, err)
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", out)
	}
	return nil
}
