package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

const statusSummary = `Show what the fleet has to do and who is doing it: due rows per reconciler (with the partitions
holding most of them), River's queue depth by state, unfinished jobs by kind, the elected leader and the
worker processes' heartbeats. --namespace and --instance-tag mean what they mean for ` + "`worker run`" + `:
only that tenant's rows are counted, and the rows left outside the filter are shown beside them.`

const (
	// statusDueCap bounds each due-row count and the partition ranking, as
	// the /metrics gauge does: a huge backlog costs a bounded read and shows
	// as "at least".
	statusDueCap = 100_000
	// statusLateAfter marks a heartbeat as late: three beats missed.
	statusLateAfter = heartbeat.LiveFor
	// statusAttempts bounds the reads of a report that fail with "out of
	// shared memory".
	statusAttempts = 4
)

// statusReport is everything `worker status` shows; its JSON form is the
// --format json output, with stable snake_case names.
type statusReport struct {
	GeneratedAt time.Time     `json:"generated_at"`
	RiverSchema string        `json:"river_schema"`
	Filter      *statusFilter `json:"filter"` // null without a filter
	DueCap      int           `json:"due_cap"`
	Due         []statusDue   `json:"due"`
	// Probed are the running reconcilers that count no due rows: a tick
	// finds the partitions it passes by a probe of its own.
	Probed []statusProbed `json:"probed"`
	Queues []statusQueue  `json:"queues"`
	// UnfinishedByKind totals the jobs of the fleet's queues that may still
	// run, by kind.
	UnfinishedByKind []statusKind  `json:"unfinished_jobs_by_kind"`
	Leader           *statusLeader `json:"leader"` // null when none is elected
	// WorkerTablePresent is false when `worker migrate` has not created
	// the heartbeat table yet; Workers is then empty.
	WorkerTablePresent bool           `json:"worker_table_present"`
	Workers            []statusWorker `json:"workers"`
}

type statusFilter struct {
	Namespace   string `json:"namespace,omitempty"`
	InstanceTag string `json:"instance_tag,omitempty"` // KEY=VALUE
}

type statusDue struct {
	Reconciler string `json:"reconciler"`
	Due        int64  `json:"due"`
	// Capped: counting stopped at DueCap rows; there are at least Due
	// (plus OutsideFilter).
	Capped bool `json:"capped"`
	// OutsideFilter is null without a filter.
	OutsideFilter *int64            `json:"outside_filter"`
	TopPartitions []statusPartition `json:"top_partitions"`
}

type statusProbed struct {
	Reconciler string `json:"reconciler"`
	// Partitions is how many partitions a tick would pass now.
	Partitions int `json:"partitions"`
}

type statusPartition struct {
	Partition int16 `json:"partition"`
	Due       int64 `json:"due"`
}

type statusQueue struct {
	Queue string `json:"queue"`
	// States has every River job state, zeros included.
	States     map[string]int64 `json:"states"`
	Unfinished int64            `json:"unfinished"`
	Total      int64            `json:"total"`
}

type statusKind struct {
	Kind string `json:"kind"`
	Jobs int64  `json:"jobs"`
}

type statusLeader struct {
	LeaderID          string    `json:"leader_id"`
	ElectedAt         time.Time `json:"elected_at"`
	ExpiresAt         time.Time `json:"expires_at"`
	ElectedSecondsAgo float64   `json:"elected_seconds_ago"`
	ExpiresInSeconds  float64   `json:"expires_in_seconds"`
	// Expired: the leadership lapsed and no client took it over.
	Expired bool `json:"expired"`
}

type statusWorker struct {
	ClientID            string    `json:"client_id"`
	Hostname            string    `json:"hostname"`
	PID                 int       `json:"pid"`
	Version             string    `json:"version"`
	StartedAt           time.Time `json:"started_at"`
	HeartbeatAt         time.Time `json:"heartbeat_at"`
	HeartbeatAgeSeconds float64   `json:"heartbeat_age_seconds"`
	// Late: no heartbeat for three beat intervals.
	Late   bool `json:"late"`
	Leader bool `json:"leader"`
}

// statusCommand implements `worker status`.
func statusCommand(ctx context.Context, args []string, stdout, _ io.Writer, _ *slog.Logger) error {
	var (
		fc          fleet.Config
		format      string
		top         int
		reconcilers []string
	)
	f := newFlagSet("status", statusSummary)
	// The settings that decide which rows are due, as `worker run` takes
	// them: the database, the tenant filter and the reconcilers' own.
	var shared []fleet.Flag
	for _, s := range fc.Flags() {
		if s.OfReconciler || slices.Contains([]string{"database-url", "river-schema", "namespace", "instance-tag"}, s.Flag) {
			if s.OfReconciler {
				s.Help = "as given to `worker run` (it decides which rows are due): " + s.Help
			}
			shared = append(shared, s)
		}
	}
	f.settings(shared)
	f.Strings(&reconcilers, "reconcilers", "FF_RECONCILERS",
		"the reconcilers the fleet runs, as given to `worker run` (default all, but those a setting turns on only with it): "+
			"shown, and deciding which of lease_expiry's and attempt_timeout's rows each takes")
	f.Int(&top, "top", "FF_STATUS_TOP", 3, "partitions to show per reconciler, most due rows first (0 hides them)")
	f.String(&format, "format", "FF_STATUS_FORMAT", "text", "output format: text or json (one document)")
	if err := f.parse(args, stdout); err != nil {
		return err
	}
	if err := fc.Validate(); err != nil {
		return usageError{err}
	}
	fc = fc.WithDefaults()
	running := workers.Running{}
	for _, name := range reconcilers {
		if _, ok := workers.ByName(name); !ok {
			return badUsage("--reconcilers: unknown reconciler %q (known: %s)", name, strings.Join(workers.Names(), ", "))
		}
		running[name] = true
	}
	if len(running) == 0 {
		for _, r := range workers.DefaultOn(fc.Settings) {
			running[r.Name] = true
		}
	}
	if top < 0 || top > jobs.PartitionCount {
		return badUsage("--top must be in 0..%d, got %d", jobs.PartitionCount, top)
	}
	if format != "text" && format != "json" {
		return badUsage("--format must be text or json, got %q", format)
	}
	dsn, schema, filter := fc.DatabaseURL, fc.RiverSchema, fc.Filter
	pool, err := dbconn.Open(ctx, dsn, dbconn.Options{MaxConns: 2, AppName: "ffreconcile-status"})
	if err != nil {
		return err
	}
	defer pool.Close()

	// The due-row counts read every partition of their table, locking 256
	// children and their indexes for a moment. On a server whose lock table
	// is small (max_locks_per_transaction below FlowFabric's recommended
	// 256) and busy, such a read can fail with "out of shared memory" while
	// the next one succeeds: retry that error a few times, as a person
	// would, before reporting it.
	var rep *statusReport
	for attempt := 1; ; attempt++ {
		rep, err = readStatus(ctx, pool, schema, filter, running, top, fc.Settings)
		var pgErr *pgconn.PgError
		if err == nil || attempt == statusAttempts || !errors.As(err, &pgErr) || pgErr.Code != "53200" { // out_of_memory, which "out of shared memory" is
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 250 * time.Millisecond):
		}
	}
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	if format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		return nil
	}
	if err := writeStatusText(stdout, rep); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// readStatus gathers the report of a fleet running the reconcilers of
// running (each counted as that fleet takes its rows: Reconciler.DueIn). The
// schema checks come first so that a database that was never migrated fails
// with what to run, not with the first query's "relation does not exist".
func readStatus(ctx context.Context, db *pgxpool.Pool, schema string, filter store.Filter, running workers.Running, top int, settings workers.Values) (*statusReport, error) {
	if err := store.CheckRiverSchema(ctx, db, schema); err != nil {
		return nil, err
	}
	if err := migrations.Check(ctx, db, schema); err != nil {
		return nil, err
	}

	rep := &statusReport{GeneratedAt: time.Now().UTC(), RiverSchema: schema, DueCap: statusDueCap}
	if !filter.Empty() {
		rep.Filter = &statusFilter{Namespace: filter.Namespace}
		if filter.TagKey != "" {
			rep.Filter.InstanceTag = filter.TagKey + "=" + filter.TagValue
		}
	}

	now := store.NowMs()
	rep.Probed = []statusProbed{}
	for _, r := range workers.All() {
		if !r.On(settings) || !running[r.Name] {
			continue
		}
		if !r.HasDue() {
			parts, err := r.Probe(ctx, db, now, jobs.PartitionCount, filter)
			if err != nil {
				return nil, fmt.Errorf("%s: find its partitions: %w", r.Name, err)
			}
			rep.Probed = append(rep.Probed, statusProbed{Reconciler: r.Name, Partitions: len(parts)})
			continue
		}
		now := r.DueAt(now, settings)
		due := r.DueIn(running)
		dc, err := due.Count(ctx, db, now, filter, statusDueCap)
		if err != nil {
			return nil, err
		}
		d := statusDue{Reconciler: r.Name, Due: dc.Due, Capped: dc.Capped, TopPartitions: []statusPartition{}}
		if !filter.Empty() {
			outside := dc.OutsideFilter
			d.OutsideFilter = &outside
		}
		if top > 0 && dc.Due > 0 {
			parts, err := due.Top(ctx, db, now, filter, top, statusDueCap)
			if err != nil {
				return nil, err
			}
			for _, p := range parts {
				d.TopPartitions = append(d.TopPartitions, statusPartition{Partition: p.Partition, Due: p.Due})
			}
		}
		rep.Due = append(rep.Due, d)
	}

	queues := jobs.Queues
	depth, err := store.RiverQueueDepth(ctx, db, schema, queues)
	if err != nil {
		return nil, err
	}
	for _, q := range queues {
		sq := statusQueue{Queue: q, States: map[string]int64{}}
		for _, s := range store.RiverJobStates {
			sq.States[s] = 0
		}
		for _, c := range depth {
			if c.Queue != q {
				continue
			}
			sq.States[c.State] += c.Jobs
			sq.Total += c.Jobs
		}
		for _, s := range store.UnfinishedJobStates {
			sq.Unfinished += sq.States[s]
		}
		rep.Queues = append(rep.Queues, sq)
	}
	kinds, err := store.RiverUnfinishedByKind(ctx, db, schema, queues)
	if err != nil {
		return nil, err
	}
	rep.UnfinishedByKind = []statusKind{}
	for _, k := range kinds {
		rep.UnfinishedByKind = append(rep.UnfinishedByKind, statusKind{Kind: k.Kind, Jobs: k.Jobs})
	}

	leader, err := store.CurrentRiverLeader(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	if leader != nil {
		rep.Leader = &statusLeader{
			LeaderID: leader.LeaderID, ElectedAt: leader.ElectedAt.UTC(), ExpiresAt: leader.ExpiresAt.UTC(),
			ElectedSecondsAgo: leader.ElectedAgo.Seconds(), ExpiresInSeconds: leader.ExpiresIn.Seconds(),
			Expired: leader.ExpiresIn < 0,
		}
	}

	rep.Workers = []statusWorker{}
	rep.WorkerTablePresent, err = store.WorkerTableExists(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	if rep.WorkerTablePresent {
		beats, err := store.ListWorkerHeartbeats(ctx, db, schema)
		if err != nil {
			return nil, err
		}
		for _, w := range beats {
			rep.Workers = append(rep.Workers, statusWorker{
				ClientID: w.ClientID, Hostname: w.Hostname, PID: w.PID, Version: w.Version,
				StartedAt: w.StartedAt.UTC(), HeartbeatAt: w.HeartbeatAt.UTC(),
				HeartbeatAgeSeconds: w.Age.Seconds(), Late: w.Age > statusLateAfter,
				Leader: rep.Leader != nil && !rep.Leader.Expired && rep.Leader.LeaderID == w.ClientID,
			})
		}
	}
	return rep, nil
}

// writeStatusText renders the report as aligned tables.
func writeStatusText(w io.Writer, rep *statusReport) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }

	filterDesc := "none"
	if rep.Filter != nil {
		var parts []string
		if rep.Filter.Namespace != "" {
			parts = append(parts, "namespace="+rep.Filter.Namespace)
		}
		if rep.Filter.InstanceTag != "" {
			parts = append(parts, "instance tag "+rep.Filter.InstanceTag)
		}
		filterDesc = strings.Join(parts, ", ")
	}
	p("Due rows at %s (filter: %s)\n", rep.GeneratedAt.Format(time.RFC3339), filterDesc)
	p("RECONCILER\tDUE\tOUTSIDE FILTER\tTOP PARTITIONS (due rows)\n")
	for _, d := range rep.Due {
		due := fmt.Sprint(d.Due)
		if d.Capped {
			due += "+"
		}
		outside := "-"
		if d.OutsideFilter != nil {
			outside = fmt.Sprint(*d.OutsideFilter)
		}
		var tops []string
		for _, tp := range d.TopPartitions {
			tops = append(tops, fmt.Sprintf("p%d: %d", tp.Partition, tp.Due))
		}
		topText := strings.Join(tops, ", ")
		if topText == "" {
			topText = "-"
		}
		p("%s\t%s\t%s\t%s\n", d.Reconciler, due, outside, topText)
	}
	p("(counts stop at %d rows, shown as N+; cancel_dispatch and cancel_reconcile both count ff_pending_cancel_groups)\n\n", rep.DueCap)
	if len(rep.Probed) > 0 {
		p("Reconcilers without due rows (each tick probes for the partitions it passes)\n")
		p("RECONCILER\tPARTITIONS TO PASS\n")
		for _, pr := range rep.Probed {
			p("%s\t%d\n", pr.Reconciler, pr.Partitions)
		}
		p("\n")
	}

	p("River queues (schema %s)\n", rep.RiverSchema)
	p("QUEUE")
	for _, s := range store.RiverJobStates {
		p("\t%s", strings.ToUpper(s))
	}
	p("\n")
	for _, q := range rep.Queues {
		p("%s", q.Queue)
		for _, s := range store.RiverJobStates {
			p("\t%d", q.States[s])
		}
		p("\n")
	}
	p("\nUnfinished jobs by kind\n")
	if len(rep.UnfinishedByKind) == 0 {
		p("none\n")
	} else {
		p("KIND\tJOBS\n")
		for _, k := range rep.UnfinishedByKind {
			p("%s\t%d\n", k.Kind, k.Jobs)
		}
	}

	p("\n")
	switch l := rep.Leader; {
	case l == nil:
		// A worker stopping cleanly resigns and deletes its heartbeat, so
		// nothing here tells "never ran" from "stopped": say what is true
		// of both.
		p("Leader: none elected (no worker is running against this schema; one that stops resigns its leadership)\n")
	case l.Expired:
		p("Leader: none; %s's leadership lapsed %s ago (no worker running?)\n", l.LeaderID, roundAge(-l.ExpiresInSeconds))
	default:
		p("Leader: %s, elected %s ago; leadership expires in %s unless renewed\n", l.LeaderID, roundAge(l.ElectedSecondsAgo), roundAge(l.ExpiresInSeconds))
	}

	p("\nWorkers (heartbeats every %s; late after %s)\n", heartbeat.DefaultInterval, statusLateAfter)
	switch {
	case !rep.WorkerTablePresent:
		p("heartbeat table %s.%s is missing: run `worker migrate`\n", rep.RiverSchema, migrations.WorkerTableName)
	case len(rep.Workers) == 0:
		p("none\n")
	default:
		p("CLIENT ID\tHOST\tPID\tVERSION\tSTARTED\tLAST HEARTBEAT\tLEADER\n")
		for _, wk := range rep.Workers {
			version := wk.Version
			if version == "" {
				version = "-"
			}
			beat := roundAge(wk.HeartbeatAgeSeconds) + " ago"
			if wk.Late {
				beat += " (late)"
			}
			leader := "no"
			if wk.Leader {
				leader = "yes"
			}
			p("%s\t%s\t%d\t%s\t%s\t%s\t%s\n", wk.ClientID, wk.Hostname, wk.PID, version,
				wk.StartedAt.Format(time.RFC3339), beat, leader)
		}
	}
	return tw.Flush()
}

// roundAge formats seconds for people: tenths below ten seconds, whole
// seconds above. The database's clock and ours may disagree by a little,
// so a negative age shows as 0s.
func roundAge(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
