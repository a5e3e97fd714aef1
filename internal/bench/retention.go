package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// RetentionResult is the retention section: trimming a backlog of
// expired terminal executions, with their sibling rows, by FlowFabric's
// set-based trim and by ours, and the lateness of lease expiry while ours
// trims it.
type RetentionResult struct {
	Backlog     int // expired terminal executions
	SiblingRows int // their rows in the sibling tables
	Kept        int // recent terminal and live executions, which must stay

	// FlowFabric's trim_retention_impl, looped over partitions one after
	// another until each returns a short batch, as its scanner would.
	SeedTime time.Duration
	// Ours: a fleet running retention only, from start to the last
	// execution deleted.
	OursTime  time.Duration
	OursStats string
	OursCPU   CPUCost

	// Lateness of lease expiry (every reconciler running, retention too)
	// while the same backlog is trimmed.
	During LatenessResult
	// LeftAfterStream is how much of the backlog was still there when the
	// lateness stream ended (0: the trim finished during it).
	LeftAfterStream int
}

// retentionTemplate is the database holding the seeded backlog, copied for
// each run.
func (e *env) retentionTemplate() string { return e.cfg.DBName + "_ret" }

// retentionAge is the bench's retention; the backlog ended twice as long ago.
const retentionAge = time.Hour

// seedRetention fills the bench database with n executions that ended two
// hours ago (each with an attempt, a dispatched completion event and two
// lease events, as a finished execution has), and n/10 that ended a minute
// ago and n/10 still running, which must stay.
func (e *env) seedRetention(ctx context.Context, n int) (siblings int, err error) {
	start := time.Now()
	now := store.NowMs()
	old, recent := now-2*retentionAge.Milliseconds(), now-time.Minute.Milliseconds()
	ended := func(i int, prefix string, createdMs, terminalMs int64) ffseed.Exec {
		return ffseed.Exec{Partition: int16(i % 256), ID: ffseed.MD5UUID(prefix + strconv.Itoa(i)), LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: "completed",
			AttemptState: "attempt_terminal", CreatedAtMs: createdMs, TerminalAtMs: ffseed.Ms(terminalMs), RawFields: benchRaw}
	}
	err = errors.Join(
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Exec { return ended(i+1, "ret", old-60_000, old+int64((i+1)%1000)) }),
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Attempt {
			return ffseed.Attempt{Partition: int16((i + 1) % 256), ExecutionID: ffseed.MD5UUID("ret" + strconv.Itoa(i+1)),
				TerminalAtMs: ffseed.Ms(old), Outcome: "success"}
		}),
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.CompletionEvent {
			return ffseed.CompletionEvent{Partition: int16((i + 1) % 256), ExecutionID: ffseed.MD5UUID("ret" + strconv.Itoa(i+1)),
				Outcome: "success", OccurredAtMs: old, CommittedAtMs: old, DispatchedAtMs: ffseed.Ms(old + 5)}
		}),
		ffseed.InsertSeries(ctx, e.pool, 2*n, func(i int) ffseed.LeaseEvent {
			g := i/2 + 1
			return ffseed.LeaseEvent{ExecutionID: ffseed.MD5UUID("ret" + strconv.Itoa(g)), EventType: [2]string{"acquired", "revoked"}[i%2],
				OccurredAtMs: old - 1000, Partition: int32(g % 256), Namespace: "bench"}
		}),
		// What must stay: recently ended, and live.
		ffseed.InsertSeries(ctx, e.pool, n/10, func(i int) ffseed.Exec { return ended(i+1, "keep", old, recent) }),
		ffseed.InsertSeries(ctx, e.pool, n/10, func(i int) ffseed.Exec {
			return ffseed.Exec{Partition: int16((i + 1) % 256), ID: ffseed.MD5UUID("live" + strconv.Itoa(i+1)),
				CreatedAtMs: recent, RawFields: benchRaw}
		}),
	)
	if err != nil {
		return 0, fmt.Errorf("seed retention backlog: %w", err)
	}
	e.seeded("retention", start)
	return 4 * n, e.settle(ctx, true)
}

// resetFrom replaces the bench database with a copy of template.
func (e *env) resetFrom(ctx context.Context, template string) error {
	e.close()
	if err := adminExec(ctx, e.cfg.AdminURL,
		dropDatabase(e.cfg.DBName),
		"CREATE DATABASE "+pgx.Identifier{e.cfg.DBName}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
		return err
	}
	return e.open(ctx)
}

// remainingExpired counts the backlog not yet trimmed.
func (e *env) remainingExpired(ctx context.Context) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'terminal' AND terminal_at_ms < $1`,
		store.NowMs()-retentionAge.Milliseconds()).Scan(&n)
	return n, err
}

// checkKept fails when anything that must stay was deleted, or a trimmed
// execution's row was left behind (only the backlog has sibling rows).
func (e *env) checkKept(ctx context.Context, want int) error {
	var n, left int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ff_exec_core),
		(SELECT count(*) FROM ff_attempt) + (SELECT count(*) FROM ff_completion_event) + (SELECT count(*) FROM ff_lease_event)`).Scan(&n, &left); err != nil {
		return err
	}
	if n != want || left != 0 {
		return fmt.Errorf("after the trim: %d executions (want %d kept), %d sibling rows left (want 0)", n, want, left)
	}
	return nil
}

// seedTrim is FlowFabric's trim_retention_impl (exec_core.rs), its
// statements as written: per partition and lane, select a batch of
// terminal executions past the cutoff, delete their rows from each sibling
// table, then the executions, in one transaction.
func seedTrim(ctx context.Context, db *pgx.Conn, partition int16, cutoff int64, batch int) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	rows, err := tx.Query(ctx, `
        SELECT execution_id
        FROM ff_exec_core
        WHERE partition_key = $1
          AND lane_id = $2
          AND lifecycle_phase = 'terminal'
          AND terminal_at_ms IS NOT NULL
          AND terminal_at_ms <= $3
          AND ($5::text IS NULL OR raw_fields->>'namespace' = $5)
          AND ($6::text IS NULL OR raw_fields->'tags'->>$6 = $7)
        ORDER BY terminal_at_ms
        LIMIT $4`, partition, "default", cutoff, batch, nil, nil, nil)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	for _, t := range store.RetentionSiblingTables.UUID {
		if _, err := tx.Exec(ctx, "DELETE FROM "+t+" WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])", partition, ids); err != nil {
			return 0, err
		}
	}
	for _, t := range store.RetentionSiblingTables.Text {
		if _, err := tx.Exec(ctx, "DELETE FROM "+t+" WHERE partition_key = $1 AND execution_id = ANY($2::text[])", partition, ids); err != nil {
			return 0, err
		}
	}
	tag, err := tx.Exec(ctx, "DELETE FROM ff_exec_core WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])", partition, ids)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), tx.Commit(ctx)
}

// retention runs the section.
func (e *env) retention(ctx context.Context) (RetentionResult, error) {
	n := e.cfg.RetentionBacklog
	res := RetentionResult{Backlog: n, Kept: n/10 + n/10}
	tmpl := e.retentionTemplate()
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	e.progress("retention: seeding %d expired terminal executions with their rows", n)
	start := time.Now()
	var err error
	if res.SiblingRows, err = e.seedRetention(ctx, n); err != nil {
		return res, err
	}
	e.close()
	if err := adminExec(ctx, e.cfg.AdminURL, dropDatabase(tmpl),
		"CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize()+" TEMPLATE "+pgx.Identifier{e.cfg.DBName}.Sanitize()); err != nil {
		return res, err
	}
	defer func() { _ = adminExec(context.Background(), e.cfg.AdminURL, dropDatabase(tmpl)) }()
	e.progress("retention: seeded in %s", time.Since(start).Round(time.Second))

	// FlowFabric's trim, one connection, partition after partition.
	if err := e.resetFrom(ctx, tmpl); err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		return res, err
	}
	start = time.Now()
	cutoff := store.NowMs() - retentionAge.Milliseconds()
	for p := range int16(256) {
		for {
			k, err := seedTrim(ctx, conn, p, cutoff, workers.DefaultBatchSize)
			if err != nil {
				conn.Close(ctx)
				return res, fmt.Errorf("seed trim of partition %d: %w", p, err)
			}
			if k < workers.DefaultBatchSize {
				break
			}
		}
	}
	res.SeedTime = time.Since(start)
	conn.Close(ctx)
	if err := e.checkKept(ctx, res.Kept); err != nil {
		return res, fmt.Errorf("seed trim: %w", err)
	}
	e.progress("retention: FlowFabric's trim: %d executions in %s (%.0f/s)", n, res.SeedTime.Round(time.Millisecond), float64(n)/res.SeedTime.Seconds())

	// Ours: retention alone.
	if err := e.resetFrom(ctx, tmpl); err != nil {
		return res, err
	}
	cfg := e.fleetConfig()
	cfg.Reconcilers = map[string]time.Duration{workers.Retention.Name: time.Second}
	cfg.Settings = workers.Values{workers.RetentionAge: retentionAge}
	if res.OursTime, res.OursCPU, res.OursStats, err = e.drainWith(ctx, cfg, workers.Retention, n, e.remainingExpired); err != nil {
		return res, err
	}
	if err := e.checkKept(ctx, res.Kept); err != nil {
		return res, fmt.Errorf("our trim: %w", err)
	}
	e.progress("retention: ours: %d executions in %s (%.0f/s); %s", n, res.OursTime.Round(time.Millisecond), float64(n)/res.OursTime.Seconds(), res.OursStats)

	// Lease expiry's lateness, every reconciler running, while the
	// backlog is trimmed.
	during := leaseLateness
	during.name = "lease expiry while retention trims"
	during.prepare = func(ctx context.Context, e *env) error { return e.resetFrom(ctx, tmpl) }
	during.configure = func(c *fleet.Config) {
		// The lease stream's own fleet (every reconciler but attempt
		// timeout, for which each of its expired leases is due too: two
		// row jobs racing per row, twice the stream), plus retention.
		leaseLateness.configure(c)
		c.Settings = workers.Values{workers.RetentionAge: retentionAge}
		c.Reconcilers[workers.Retention.Name] = workers.Retention.Interval
	}
	during.afterStream = func(ctx context.Context, e *env) error {
		left, err := e.remainingExpired(ctx)
		res.LeftAfterStream = left
		return err
	}
	if res.During, err = e.lateness(ctx, during, e.cfg.LatenessLeads[0]); err != nil {
		return res, err
	}
	return res, nil
}
