package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// ScaleResult shows that finding due partitions does not grow with not-due
// rows, and how fast a large backlog drains.
type ScaleResult struct {
	SmallRows, LargeRows int
	SmallTick, LargeTick time.Duration // median of the tick's due-partitions query alone
	// SmallFanOut and LargeFanOut are the medians of a whole tick, from its
	// start to its fan-out (workers.Set.Tick: the due queries, the busy
	// checks and the insert of 256 scans).
	SmallFanOut, LargeFanOut time.Duration
	LargePlan                string // EXPLAIN (ANALYZE) with the large table
	ScanPlan                 string // EXPLAIN (ANALYZE) of one partition scan
	Backlog                  int
	BacklogDrain             time.Duration
	BacklogRate              float64
	BacklogStats             string
}

// tickRounds is how many times each database's tick is timed.
const tickRounds = 30

func (e *env) scale(ctx context.Context) (ScaleResult, error) {
	res := ScaleResult{SmallRows: e.cfg.ScaleSmall, LargeRows: e.cfg.ScaleLarge, Backlog: e.cfg.Backlog}
	// Both sizes are loaded first, into two databases, and their tick
	// queries timed in turns, so a slow spell of the machine slows both
	// alike. Timed one after the other, each right after its load, the ratio
	// came out anywhere from 0.97 to 1.75 for one build. Turns do not remove
	// all of that spread (docs/performance.md, "Promotions under `off`:
	// where a row's time goes under load", its bullet "The scale
	// section's spread").
	load := func(rows int) error {
		e.progress("scale: load %d not-due rows", rows)
		if err := e.reset(ctx); err != nil {
			return err
		}
		// One due row in every partition, so each probe finds something
		// and the tick fans out to all 256 partitions.
		if err := leaseScenario.seed(ctx, e, jobs.PartitionCount, rows); err != nil {
			return err
		}
		return e.settle(ctx, true)
	}
	if err := load(e.cfg.ScaleSmall); err != nil {
		return res, err
	}
	e.close()
	small := e.smallDBName()
	if err := adminExec(ctx, e.cfg.AdminURL,
		dropDatabase(small),
		"ALTER DATABASE "+pgx.Identifier{e.cfg.DBName}.Sanitize()+" RENAME TO "+pgx.Identifier{small}.Sanitize()); err != nil {
		return res, err
	}
	defer func() {
		_ = adminExec(context.Background(), e.cfg.AdminURL, dropDatabase(small))
	}()
	if err := load(e.cfg.ScaleLarge); err != nil {
		return res, err
	}
	smallURL, err := withDatabase(e.cfg.AdminURL, small)
	if err != nil {
		return res, err
	}
	e.progress("scale: tick, %d against %d not-due rows, alternating", e.cfg.ScaleSmall, e.cfg.ScaleLarge)
	queries, fanOuts, err := e.medianTicks(ctx, smallURL, e.url)
	if err != nil {
		return res, err
	}
	res.SmallTick, res.LargeTick = queries[0], queries[1]
	res.SmallFanOut, res.LargeFanOut = fanOuts[0], fanOuts[1]
	// Plans with the large table in place.
	now := store.NowMs()
	if res.LargePlan, err = e.explain(ctx, `SELECT s.p FROM (SELECT g::smallint AS p FROM generate_series(0, $1::int - 1) AS g) AS s
	 CROSS JOIN LATERAL (SELECT 1 FROM ff_attempt a WHERE a.partition_key = s.p
	   AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2 LIMIT 1) AS due`, jobs.PartitionCount, now); err != nil {
		return res, err
	}
	if res.ScanPlan, err = e.explain(ctx, `SELECT a.execution_id::text, a.attempt_index, a.lease_expires_at_ms
		  FROM ff_attempt a
		 WHERE a.partition_key = $1 AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2
		 ORDER BY a.lease_expires_at_ms, a.execution_id, a.attempt_index LIMIT $3`, int16(7), now, 1000); err != nil {
		return res, err
	}

	// Backlog drain.
	e.progress("scale: drain a backlog of %d expired leases", e.cfg.Backlog)
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	if err := leaseScenario.seed(ctx, e, e.cfg.Backlog, 0); err != nil {
		return res, err
	}
	if err := e.settle(ctx, false); err != nil {
		return res, err
	}
	fc := e.fleetConfig()
	withoutAttemptTimeout(&fc)
	rate, stats, _, err := e.runOurs(ctx, fc, workers.LeaseExpiry.Name, e.cfg.Backlog, func(ctx context.Context) (int, error) {
		return leaseScenario.remaining(ctx, e.pool)
	})
	if err != nil {
		return res, err
	}
	res.BacklogRate, res.BacklogStats = rate, stats
	res.BacklogDrain = time.Duration(float64(e.cfg.Backlog) / rate * float64(time.Second))
	e.progress("scale: tick %s (%d rows) vs %s (%d rows); backlog drained in %s (%.0f rows/s)",
		res.SmallTick, res.SmallRows, res.LargeTick, res.LargeRows, res.BacklogDrain.Round(time.Millisecond), rate)
	return res, nil
}

// medianTicks times, in each database of urls, taking turns, the lease
// expiry tick as the worker runs it: its due-partitions query alone (through
// the tick pool, with a cached generic plan: see internal/fleet), and the
// whole tick from its start to its fan-out (workers.Set.Tick). It returns
// each database's medians. After each tick it deletes the scans the tick
// enqueued, untimed, so that every tick finds all 256 partitions due and
// none with a scan already queued.
func (e *env) medianTicks(ctx context.Context, urls ...string) (queries, fanOuts []time.Duration, err error) {
	fleets := make([]*fleet.Fleet, 0, len(urls))
	defer func() {
		for _, f := range fleets {
			f.Close()
		}
	}()
	for _, u := range urls {
		c := e.fleetConfig()
		c.DatabaseURL = u
		f, err := fleet.New(ctx, c)
		if err != nil {
			return nil, nil, err
		}
		fleets = append(fleets, f)
	}
	scanKind := jobs.LeaseExpiryScanArgs{}.Kind()
	querySamples := make([][]time.Duration, len(urls))
	tickSamples := make([][]time.Duration, len(urls))
	order := make([]int, len(urls))
	for i := range order {
		order[i] = i
	}
	for range tickRounds {
		// Each round in the opposite order of the last, so neither database
		// is always the one queried first.
		slices.Reverse(order)
		for _, i := range order {
			f := fleets[i]
			start := time.Now()
			parts, err := store.ExpiredLeases.Partitions(ctx, f.TickPool, store.NoLowerBound, store.NowMs(), jobs.PartitionCount, store.Filter{})
			if err != nil {
				return nil, nil, err
			}
			querySamples[i] = append(querySamples[i], time.Since(start))
			if len(parts) != jobs.PartitionCount {
				return nil, nil, fmt.Errorf("tick found %d due partitions; want %d", len(parts), jobs.PartitionCount)
			}
			start = time.Now()
			if err := f.Workers.Tick(ctx, f.Client, workers.LeaseExpiry); err != nil {
				return nil, nil, err
			}
			tickSamples[i] = append(tickSamples[i], time.Since(start))
			tag, err := f.WorkPool.Exec(ctx, `DELETE FROM `+pgx.Identifier{f.Config.RiverSchema, "river_job"}.Sanitize()+` WHERE kind = $1`, scanKind)
			if err != nil {
				return nil, nil, fmt.Errorf("delete the tick's scans: %w", err)
			}
			if tag.RowsAffected() != jobs.PartitionCount {
				return nil, nil, fmt.Errorf("tick enqueued %d scans; want %d", tag.RowsAffected(), jobs.PartitionCount)
			}
		}
	}
	return medians(querySamples), medians(tickSamples), nil
}

// medians returns the median of each list of samples (sorting them).
func medians(samples [][]time.Duration) []time.Duration {
	out := make([]time.Duration, len(samples))
	for i, ds := range samples {
		slices.Sort(ds)
		out[i] = ds[len(ds)/2]
	}
	return out
}

func (e *env) explain(ctx context.Context, sql string, args ...any) (string, error) {
	rows, err := e.pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "+sql, args...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var lines []string
	children, skipped := 0, 0
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		// A plan over 256 partitions repeats one child (and its detail
		// lines) per partition: keep the first few children and the summary.
		if strings.Contains(line, "ff_attempt_p") && strings.Contains(line, "->") {
			children++
		}
		if children > 4 && !strings.HasPrefix(strings.TrimSpace(line), "Planning") &&
			!strings.HasPrefix(strings.TrimSpace(line), "Execution") {
			skipped++
			continue
		}
		lines = append(lines, line)
	}
	if skipped > 0 {
		lines = append(lines[:len(lines)-2], append([]string{fmt.Sprintf("   ... (%d more lines: the other partitions' probes)", skipped)}, lines[len(lines)-2:]...)...)
	}
	return strings.Join(lines, "\n"), rows.Err()
}
