package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/demo"
	"github.com/flowfabric/ffreconcile/migrations"
)

const demoSummary = `Feed a demo workload into the ff_* tables for the reconcilers to act on: executions whose leases
expire, suspensions timing out with every timeout behaviour (NULL, fail, cancel, expire, escalate,
auto_resume_with_timeout_signal and an unknown one), delayed executions coming due, and quorum edge
groups with pending sibling cancels (plus orphan and flag-less pending rows), over random partitions.
Every row has namespace "demo" and tag cairn.instance_id=demo-1. Deadlines fall within a few seconds.
It prints one line per second of what it inserted, until interrupted (or --duration passes).
--once inserts one batch (--rate items, at least one of every kind) and exits.
Never point it at a database that holds real FlowFabric data.`

// demoCommand implements `worker demo`.
func demoCommand(ctx context.Context, args []string, stdout, _ io.Writer, logger *slog.Logger) error {
	var (
		dsn      string
		rate     int
		duration time.Duration
		once     bool
		bad      bool
	)
	f := newFlagSet("demo", demoSummary)
	databaseURLFlag(f, &dsn)
	f.Int(&rate, "rate", "FF_DEMO_RATE", demo.DefaultRate, "items per second (each is one row a reconciler acts on)")
	f.Duration(&duration, "duration", "FF_DEMO_DURATION", 0, "stop after this long (0: until interrupted)")
	f.Bool(&once, "once", "FF_DEMO_ONCE", false, "insert one batch and exit")
	f.Bool(&bad, "malformed", "FF_DEMO_MALFORMED", false, "also write deliberately malformed rows (a suspension timeout behaviour FlowFabric does not define, a pending cancel row without its edge group), each of which the worker logs as a warning")
	if err := f.parse(args, stdout); err != nil {
		return err
	}
	if rate < 1 || rate > 10_000 {
		return badUsage("--rate must be in 1..10000, got %d", rate)
	}
	if duration < 0 {
		return badUsage("--duration must not be negative, got %s", duration)
	}
	if dsn == "" {
		dsn = dbconn.DefaultURL
	}
	if err := dbconn.Validate(dsn); err != nil {
		return usageError{err}
	}
	pool, err := dbconn.Open(ctx, dsn, dbconn.Options{MaxConns: 2, AppName: "ffreconcile-demo"})
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Check(ctx, pool, ""); err != nil {
		return dbconn.Scrub(err, dsn)
	}

	feeder := demo.NewFeeder(pool, 0)
	feeder.Malformed = bad
	if once {
		c, err := feeder.Insert(ctx, max(rate, demo.DeckSize), time.Now())
		if err != nil {
			return dbconn.Scrub(err, dsn)
		}
		fmt.Fprintf(stdout, "demo: inserted %s\n", c)
		return nil
	}
	logger.Info("feeding the demo workload; interrupt to stop", "rate", rate, "duration", duration)
	total, err := demo.Run(ctx, feeder, rate, duration, func(c demo.Counts) {
		fmt.Fprintf(stdout, "demo: +%s\n", c)
	})
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	fmt.Fprintf(stdout, "demo: stopped after %s\n", total)
	return nil
}
