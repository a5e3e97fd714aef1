package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// partialIndex is an index of ours on a FlowFabric table partitioned 256
// ways (a reconciler's Object): partial, so that the table's other rows
// cost it nothing, and built without blocking writers on a large table.
type partialIndex struct {
	// name is the parent index; each partition's is its table's name plus
	// childSuffix.
	name, childSuffix string
	// table is the FlowFabric table; cols the definition after ON <table>.
	table, cols string
	// what names it in errors and reports, e.g. "retention's index".
	what string
}

// onlineIndexRows is the estimated size of a table above which an index is
// built one partition at a time with CREATE INDEX CONCURRENTLY, so writers
// are never blocked; below it one CREATE INDEX blocks writes for well under
// a second.
const onlineIndexRows = 100_000

// object is the index as an Object.
func (ix partialIndex) object() Object {
	return Object{
		Name: ix.name, On: ix.table, DDL: ix.cols,
		Apply: func(ctx context.Context, pool *pgxpool.Pool, _ string) (string, error) {
			if err := ix.apply(ctx, pool, onlineIndexRows); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s: %s on %s is in place", ix.name, ix.what, ix.table), nil
		},
		Check: func(ctx context.Context, pool *pgxpool.Pool, _ string) error { return ix.check(ctx, pool) },
	}
}

// check reports the index missing or unfinished, with what to run: without
// it the reconciler's ticks would read the table whole.
func (ix partialIndex) check(ctx context.Context, pool *pgxpool.Pool) error {
	var valid *bool
	if err := pool.QueryRow(ctx, `SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))`,
		ix.name).Scan(&valid); err != nil {
		return fmt.Errorf("read catalog: %w", err)
	}
	switch {
	case valid == nil:
		return fmt.Errorf("%s %s on %s is missing; run `worker migrate` to create it", ix.what, ix.name, ix.table)
	case !*valid:
		return fmt.Errorf("%s %s on %s is unfinished (an interrupted build); run `worker migrate` to finish it", ix.what, ix.name, ix.table)
	}
	return nil
}

// apply creates the index if it is missing (or was left unfinished);
// running it again is a no-op. On a table of onlineRows rows or more
// (estimated) it is built online: the parent's index is created ON ONLY
// (invalid until every partition has its own), then each partition's index
// CONCURRENTLY and attached. An interrupted build is resumed where it
// stopped: invalid partition indexes are dropped and rebuilt.
func (ix partialIndex) apply(ctx context.Context, pool *pgxpool.Pool, onlineRows float64) error {
	fail := func(err error) error { return fmt.Errorf("%s %s: %w", ix.what, ix.name, err) }
	var (
		exists, valid bool
		rows          float64
	)
	err := pool.QueryRow(ctx, `
SELECT to_regclass($1) IS NOT NULL,
       COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false),
       COALESCE((SELECT sum(GREATEST(c.reltuples, 0)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                  WHERE i.inhparent = to_regclass($2)), 0)`, ix.name, ix.table).Scan(&exists, &valid, &rows)
	if err != nil {
		return fail(err)
	}
	if exists && valid {
		return nil
	}
	if !exists && rows < onlineRows {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// See ApplyWorkerTable: CREATE … IF NOT EXISTS races itself.
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.' || $1))`, ix.name); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+ix.name+` ON `+ix.table+` `+ix.cols)
			return err
		})
		if err != nil {
			return fail(err)
		}
		return nil
	}
	// Online: one partition at a time, none in a transaction block.
	if _, err := pool.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+ix.name+` ON ONLY `+ix.table+` `+ix.cols); err != nil {
		return fail(err)
	}
	rs, err := pool.Query(ctx, `
SELECT c.relname,
       (SELECT ci.relname FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid
         WHERE ci.relname = c.relname || $3),
       COALESCE((SELECT x.indisvalid FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid
         WHERE ci.relname = c.relname || $3), false),
       EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_class ci ON ci.oid = ii.inhrelid
         WHERE ii.inhparent = to_regclass($1) AND ci.relname = c.relname || $3)
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass($2)
 ORDER BY c.relname`, ix.name, ix.table, ix.childSuffix)
	if err != nil {
		return fail(err)
	}
	type child struct {
		table           string
		index           *string
		valid, attached bool
	}
	children, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (child, error) {
		var c child
		return c, r.Scan(&c.table, &c.index, &c.valid, &c.attached)
	})
	if err != nil {
		return fail(err)
	}
	for _, c := range children {
		idx := c.table + ix.childSuffix
		if c.index != nil && !c.valid {
			if _, err := pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{idx}.Sanitize()); err != nil {
				return fail(fmt.Errorf("drop unfinished %s: %w", idx, err))
			}
		}
		if c.index == nil || !c.valid {
			if _, err := pool.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{idx}.Sanitize()+
				` ON `+pgx.Identifier{c.table}.Sanitize()+` `+ix.cols); err != nil {
				return fail(fmt.Errorf("build %s: %w", idx, err))
			}
		}
		if !c.attached {
			if _, err := pool.Exec(ctx, `ALTER INDEX `+ix.name+` ATTACH PARTITION `+pgx.Identifier{idx}.Sanitize()); err != nil {
				return fail(fmt.Errorf("attach %s: %w", idx, err))
			}
		}
	}
	return nil
}
