package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// warm has n connections of pool plan a statement over every partition of
// the reconciler's tables, so that each design runs on connections in the
// state a long-running process's are in. A backend builds its cache entries
// for a partition and its indexes the first time it plans against it: ~0.15 s
// per connection for ff_exec_core's 256 partitions on the benchmark machine.
// The seed's loop used to run on the bench connection that had just loaded
// the rows, partly warm from it, while each of our work connections paid for
// it inside the measured window (docs/performance.md, "Warm connections").
func warm(ctx context.Context, pool *pgxpool.Pool, n int, reconciler string) error {
	r, ok := workers.ByName(reconciler)
	if !ok {
		return fmt.Errorf("warm connections: no tables listed for reconciler %q", reconciler)
	}
	return eachConn(ctx, pool, n, func(c *pgxpool.Conn) error {
		for _, t := range r.Tables {
			// EXPLAIN plans without running: the planner opens every
			// partition of t and each of its indexes.
			if _, err := c.Exec(ctx, "EXPLAIN SELECT 1 FROM "+pgx.Identifier{t}.Sanitize()); err != nil {
				return fmt.Errorf("warm connections on %s: %w", t, err)
			}
		}
		return nil
	})
}

// eachConn runs fn on n distinct connections of pool, capped at the pool's
// size (holding more would wait forever). They are held at once, so that
// they are distinct, and released after, so the pool hands them out first
// (its idle ones are a stack).
func eachConn(ctx context.Context, pool *pgxpool.Pool, n int, fn func(*pgxpool.Conn) error) error {
	n = min(n, int(pool.Config().MaxConns))
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warm connections: %w", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// warmFleet warms every connection the fleet's reconcilers plan on: the
// work pool's, the dependency reconciler's dispatch lanes, and the tick
// pool's, which build the generic plans of every
// tick's queries (workers.Set.PlanTicks; planning them opens every partition
// of the tables the ticks probe). A process keeps those plans from its first
// ticks on, and they cost 90–180 ms each to build: without them the window of
// a fresh process's first tick held ~0.5 s of such planning, on one core,
// before any scan was enqueued.
func (e *env) warmFleet(ctx context.Context, f *fleet.Fleet, reconciler string) error {
	start := time.Now()
	if err := warm(ctx, f.WorkPool, int(f.WorkPool.Config().MaxConns), reconciler); err != nil {
		return err
	}
	if err := eachConn(ctx, f.TickPool, int(f.TickPool.Config().MaxConns), func(c *pgxpool.Conn) error {
		return f.Workers.PlanTicks(ctx, c)
	}); err != nil {
		return fmt.Errorf("warm connections: %w", err)
	}
	n := int(f.WorkPool.Config().MaxConns + f.TickPool.Config().MaxConns)
	if lanes := f.DispatchLanes; len(lanes) > 0 && reconciler == workers.Dependency.Name {
		// Each lane plans its partitions' dispatch statements, as after
		// its first event of each.
		lv, err := store.LoadLeaves(ctx, f.WorkPool, store.DispatchTables...)
		if err != nil {
			return fmt.Errorf("warm connections: %w", err)
		}
		for i, lane := range lanes {
			var parts []int16
			for p := i; p < jobs.PartitionCount; p += len(lanes) {
				parts = append(parts, int16(p))
			}
			if err := store.WarmDispatchOnLeaves(ctx, lane, lv, parts, f.Config.Filter); err != nil {
				return fmt.Errorf("warm connections: %w", err)
			}
		}
		n += len(lanes)
	}
	e.progress("warmed the fleet's %d connections in %s", n, time.Since(start).Round(time.Millisecond))
	return nil
}
