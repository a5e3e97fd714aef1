package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
)

// promoteConfig is what `worker promote` is configured with.
type promoteConfig struct {
	databaseURL string
	riverSchema string
	args        jobs.PromoteArgs
}

const promoteSummary = `Enqueue one ad-hoc delayed promotion (kind ff.delayed_promotion.promote, queue ff_rows) and print its job id.
Name the execution as --execution '{fp:N}:<uuid>' or as --partition N --execution-id UUID. --at schedules the
promotion for the execution's delay-until: an RFC 3339 time (2026-05-01T12:30:00Z) or a duration from now (30s, 5m);
without it the promotion runs at once. A running fleet (worker run) does the work; a promotion that is not due yet
when it runs waits for the delay-until (up to 1h), and one for an execution that is not delayed changes nothing.
From any language, inside your own transaction, one SQL call enqueues the same job (worker migrate installs it):
  SELECT * FROM river.ffreconcile_promote(7::smallint, '<uuid>'::uuid, '2026-05-01T12:30:00Z'::timestamptz)
returning job_id and duplicate (README, "From another language").`

// parsePromoteFlags parses and checks the flags; now anchors a duration
// given to --at.
func parsePromoteFlags(args []string, stdout io.Writer, now time.Time) (*promoteConfig, error) {
	var pc promoteConfig
	var execution, partition, executionID, at string
	f := newFlagSet("promote", promoteSummary)
	databaseURLFlag(f, &pc.databaseURL)
	f.String(&pc.riverSchema, "river-schema", "FF_RIVER_SCHEMA", jobs.DefaultRiverSchema, "Postgres schema holding River's tables")
	f.String(&execution, "execution", "FF_PROMOTE_EXECUTION", "", "the execution, in FlowFabric's form {fp:N}:<uuid>")
	f.String(&partition, "partition", "FF_PROMOTE_PARTITION", "", "the execution's flow partition, 0..255 (with --execution-id)")
	f.String(&executionID, "execution-id", "FF_PROMOTE_EXECUTION_ID", "", "the execution's bare UUID (with --partition)")
	f.String(&at, "at", "FF_PROMOTE_AT", "", "when to promote: an RFC 3339 time, or a duration from now such as 30s (default now)")
	if err := f.parse(args, stdout); err != nil {
		return nil, err
	}

	switch {
	case execution != "" && (partition != "" || executionID != ""):
		return nil, badUsage("give either --execution or --partition with --execution-id, not both")
	case execution != "":
		id, err := jobs.ParseExecutionID(execution)
		if err != nil {
			return nil, badUsage("--execution: %v", err)
		}
		pc.args.Execution = id.String()
	case partition == "" && executionID == "":
		return nil, badUsage("no execution given: use --execution '{fp:N}:<uuid>', or --partition N with --execution-id UUID")
	case executionID == "":
		return nil, badUsage("--partition needs --execution-id")
	case partition == "":
		return nil, badUsage("--execution-id needs --partition")
	default:
		n, err := strconv.Atoi(strings.TrimSpace(partition))
		if err != nil {
			return nil, badUsage("--partition %q is not a whole number", partition)
		}
		if err := jobs.ValidatePartition(n); err != nil {
			return nil, badUsage("--partition: %v", err)
		}
		u, err := jobs.ParseUUID(executionID)
		if err != nil {
			return nil, badUsage("--execution-id: %v", err)
		}
		p := int16(n)
		pc.args.Partition, pc.args.ExecutionID = &p, u
	}
	if at != "" {
		t, err := parseAt(at, now)
		if err != nil {
			return nil, usageError{err}
		}
		pc.args.At = &t
	}
	if err := pc.args.Validate(); err != nil { // the checks above should make this unreachable
		return nil, usageError{err}
	}
	if err := migrations.ValidateSchemaName(pc.riverSchema); err != nil {
		return nil, usageError{err}
	}
	if pc.databaseURL == "" {
		pc.databaseURL = dbconn.DefaultURL
	}
	if err := dbconn.Validate(pc.databaseURL); err != nil {
		return nil, usageError{err}
	}
	return &pc, nil
}

// parseAt reads --at: an RFC 3339 time, or a non-negative Go duration counted
// from now (truncated to milliseconds, FlowFabric's time unit).
func parseAt(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--at %s: a duration counts from now and must not be negative", s)
		}
		return now.Add(d).UTC().Truncate(time.Millisecond), nil
	}
	return time.Time{}, fmt.Errorf("--at %q: want an RFC 3339 time (2026-05-01T12:30:00Z) or a duration from now (30s, 5m)", s)
}

func promoteCommand(ctx context.Context, args []string, stdout, _ io.Writer, _ *slog.Logger) error {
	pc, err := parsePromoteFlags(args, stdout, time.Now())
	if err != nil {
		return err
	}
	pool, err := dbconn.Open(ctx, pc.databaseURL, dbconn.Options{MaxConns: 2, AppName: "ffreconcile-promote"})
	if err != nil {
		return err
	}
	defer pool.Close()

	if err := store.CheckRiverSchema(ctx, pool, pc.riverSchema); err != nil {
		return dbconn.Scrub(err, pc.databaseURL)
	}

	// Insert-only: no workers and no queues, so this client never fetches
	// or works jobs; PromoteArgs' own hook validates the args.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: pc.riverSchema})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	res, err := client.Insert(ctx, pc.args, nil)
	if err != nil {
		return fmt.Errorf("enqueue promotion: %w", dbconn.Scrub(err, pc.databaseURL))
	}
	target, _ := pc.args.Target()
	if res.UniqueSkippedAsDuplicate {
		fmt.Fprintf(stdout, "skipped: an identical promotion is already queued (job %d)\n", res.Job.ID)
	} else {
		when := "now"
		if pc.args.At != nil {
			when = "at " + pc.args.At.Format(time.RFC3339Nano)
		}
		fmt.Fprintf(stdout, "enqueued job %d: promote %s %s\n", res.Job.ID, target, when)
	}
	promoteNote(ctx, pool, target, stdout)
	return nil
}

// promoteNote says, after the job is in, when it will change nothing as
// things stand: the execution is missing, or is not delayed. The job is
// enqueued all the same (a service may enqueue a promotion before the
// execution is written; the job re-checks when it runs). A database
// without FlowFabric's tables, or a failed read, says nothing.
func promoteNote(ctx context.Context, db store.DB, target jobs.ExecutionID, stdout io.Writer) {
	t, err := store.ReadPromotionTarget(ctx, db, target.Partition, target.UUID)
	switch {
	case err != nil:
	case !t.Exists:
		fmt.Fprintf(stdout, "note: execution %s is not in ff_exec_core (yet): unless it is written as delayed before the job runs, the promotion changes nothing\n", target)
	case !t.Delayed:
		fmt.Fprintf(stdout, "note: execution %s is not delayed (public state %s): unless it is delayed again before the job runs, the promotion changes nothing\n", target, t.PublicState)
	}
}
