package testdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reuse. A clone of the 256-partition template copies ~25,000 files and
// its drop unlinks them: ~0.55 s and ~0.3 s of the server's CPU (kernel
// time, on tmpfs), a third of the suite's CPU with ~250 test databases a
// run. With ReuseEnv set (`make test` sets it), a finished test's database
// is emptied instead and offered to the next test, of any test binary, that
// asks for a clone of the same template:
//
//   - Only the tables the test wrote are emptied: the server's cumulative
//     statistics count every table's inserted, updated and deleted rows
//     (reset when the database is offered), so no partition is opened, let
//     alone planned; a TRUNCATE of a leaf partition costs its few files.
//     (Emptying by DELETE through the parents, tried before, cost more than
//     a clone: each DELETE was planned over all 256 partitions.)
//   - A database is offered again only when it is as its template left it:
//     no catalog row written since the test got it (a CREATE, ALTER,
//     COMMENT, GRANT or ANALYZE writes one), the same number of rows in each
//     catalog (a DROP leaves none behind), no table vacuumed or analyzed
//     (either changes pg_class's planner statistics in place), every
//     sequence unused, and no row changed in a table the template filled. Anything else, or a
//     connection still open, and it is dropped as before.
//   - Offered databases are named ffr_f_<template>_<random>; a test claims
//     one by renaming it to its own ffr_t_<pid>_<random> (a rename is
//     atomic: two claimants cannot get the same one). scripts/test-postgres.sh
//     stop drops those left at the end of a run.
//
// A regression here shows as a test seeing rows or objects of an earlier
// test, so the checks err on the side of dropping.

// ReuseEnv is the environment variable that turns reuse on ("1").
const ReuseEnv = "FF_TESTDB_REUSE"

func reuseEnabled() bool { return os.Getenv(ReuseEnv) == "1" }

// freePrefix is the name prefix of the databases offered for reuse that
// were cloned from template.
func freePrefix(template string) string {
	return "ffr_f_" + strings.TrimPrefix(template, "ffr_") + "_"
}

// pristine is what a database cloned from one template looks like before
// any test touched it, read once per process from the first such database
// it gets (cloned or claimed, it is as the template left it).
type pristine struct {
	fingerprint string
	filled      map[uint32]bool // tables with rows (river_migration)
}

var (
	pristineMu sync.Mutex
	pristines  = map[string]*pristine{}
)

// fingerprintSQL sums up what a test could change in a database's catalogs
// without leaving a row written after it got the database: the number of
// rows of each catalog a DDL statement writes, the database's own settings
// and the sequences used. (A TRUNCATE leaves a table's and its indexes'
// planner statistics as an empty table's, not exactly as CREATE left them,
// so pg_class's statistics are not compared; a VACUUM or ANALYZE that
// changes them in place is found by its count instead.)
const fingerprintSQL = `
SELECT concat_ws(' ',
  (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_attribute), (SELECT count(*) FROM pg_namespace), (SELECT count(*) FROM pg_proc),
  (SELECT count(*) FROM pg_type), (SELECT count(*) FROM pg_constraint), (SELECT count(*) FROM pg_index),
  (SELECT count(*) FROM pg_trigger), (SELECT count(*) FROM pg_attrdef), (SELECT count(*) FROM pg_description),
  (SELECT count(*) FROM pg_statistic), (SELECT count(*) FROM pg_depend), (SELECT count(*) FROM pg_rewrite),
  (SELECT count(*) FROM pg_inherits), (SELECT count(*) FROM pg_sequence), (SELECT count(*) FROM pg_default_acl),
  (SELECT count(*) FROM pg_policy), (SELECT count(*) FROM pg_extension),
  (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
  (SELECT count(*) FROM pg_sequences WHERE last_value IS NOT NULL))`

// writtenSinceSQL tells whether a catalog row was written after xid $1 by
// another transaction than this one (whose TRUNCATE and sequence restarts
// write pg_class and pg_sequence rows).
var writtenSinceSQL = func() string {
	var b strings.Builder
	b.WriteString(`WITH me AS (SELECT backend_xid AS x FROM pg_stat_activity WHERE pid = pg_backend_pid()) SELECT `)
	for i, cat := range []string{"pg_class", "pg_attribute", "pg_namespace", "pg_proc", "pg_type", "pg_constraint",
		"pg_index", "pg_trigger", "pg_attrdef", "pg_description", "pg_statistic", "pg_depend", "pg_rewrite",
		"pg_inherits", "pg_sequence", "pg_default_acl", "pg_policy", "pg_extension"} {
		if i > 0 {
			b.WriteString(" OR ")
		}
		fmt.Fprintf(&b, "EXISTS (SELECT 1 FROM %s, me WHERE age(xmin) < age($1::text::xid) AND xmin IS DISTINCT FROM me.x)", cat)
	}
	return b.String()
}()

// readPristine records, once per process and template, what db looks like
// untouched.
func readPristine(ctx context.Context, template string, db *DB) error {
	pristineMu.Lock()
	defer pristineMu.Unlock()
	if pristines[template] != nil {
		return nil
	}
	p := &pristine{filled: map[uint32]bool{}}
	if err := db.Pool.QueryRow(ctx, fingerprintSQL).Scan(&p.fingerprint); err != nil {
		return fmt.Errorf("fingerprint: %w", err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT oid FROM pg_class WHERE relkind = 'r'
		AND relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace) AND pg_relation_size(oid) > 0`)
	if err != nil {
		return fmt.Errorf("tables with rows: %w", err)
	}
	oids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return fmt.Errorf("tables with rows: %w", err)
	}
	for _, o := range oids {
		p.filled[o] = true
	}
	pristines[template] = p
	return nil
}

// currentXidSQL assigns and returns a transaction id (as an xid, without
// the epoch): every transaction starting after it has a later one.
const currentXidSQL = `SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text`

// claim renames a database offered for reuse from template to a new test
// database name, returning "" when there is none. since is a transaction
// id no later than the claim: catalog rows written after it are the test's.
func claim(ctx context.Context, admin *pgx.Conn, template string) (name, since string) {
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, freePrefix(template))
	if err != nil {
		return "", ""
	}
	free, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", ""
	}
	for _, f := range free {
		if err := admin.QueryRow(ctx, currentXidSQL).Scan(&since); err != nil {
			return "", ""
		}
		name = newName()
		// Fails when another test binary claimed it first.
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{f}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err == nil {
			return name, since
		}
	}
	return "", ""
}

// release empties db, whose pool is closed, and offers it for reuse, or
// drops it when it cannot be shown to be as its template left it (see the
// comment at the top of this file).
func release(db *DB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := db.Name
	if err := empty(ctx, db); err != nil {
		dropDatabase(name)
		return
	}
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		dropDatabase(name)
		return
	}
	defer admin.Close(ctx)
	free := freePrefix(db.template) + randomSuffix()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" RENAME TO "+pgx.Identifier{free}.Sanitize()); err != nil {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
}

// errNotPristine says a database is not as its template left it.
var errNotPristine = errors.New("not as its template left it")

// empty truncates the tables the test wrote and restarts the sequences it
// used, in one transaction committed only when the database is then as the
// template left it.
func empty(ctx context.Context, db *DB) error {
	name := db.Name
	pristineMu.Lock()
	p := pristines[db.template]
	pristineMu.Unlock()
	if p == nil || db.since == "" {
		return fmt.Errorf("%w: no record of its template %q", errNotPristine, db.template)
	}
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return err
	}
	// The test's pools are closed; their backends end within moments.
	for i := 0; ; i++ {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&n); err != nil {
			admin.Close(ctx)
			return err
		}
		if n == 0 {
			break
		}
		if i == 100 {
			admin.Close(ctx)
			return fmt.Errorf("%d connections left", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	admin.Close(ctx)

	dbURL, err := WithDatabase(AdminURL(), name)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck

	// Every backend that wrote has ended, and a backend reports its
	// counts before it leaves pg_stat_activity.
	var vacuumed int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(sum(pg_stat_get_vacuum_count(oid) + pg_stat_get_autovacuum_count(oid)
		+ pg_stat_get_analyze_count(oid) + pg_stat_get_autoanalyze_count(oid)), 0)::bigint
		FROM pg_class WHERE relkind IN ('r', 'p') AND relnamespace <> 'pg_catalog'::regnamespace`).Scan(&vacuumed); err != nil {
		return err
	}
	if vacuumed > 0 {
		return fmt.Errorf("%w: %d tables vacuumed or analyzed", errNotPristine, vacuumed)
	}
	rows, err := tx.Query(ctx, `SELECT oid, oid::regclass::text FROM pg_class WHERE relkind = 'r'
		AND relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
		AND pg_stat_get_tuples_inserted(oid) + pg_stat_get_tuples_updated(oid) + pg_stat_get_tuples_deleted(oid) > 0`)
	if err != nil {
		return err
	}
	var written []string
	var oid uint32
	var table string
	if _, err := pgx.ForEachRow(rows, []any{&oid, &table}, func() error {
		if p.filled[oid] {
			return fmt.Errorf("%w: %s written", errNotPristine, table)
		}
		written = append(written, table)
		return nil
	}); err != nil {
		return err
	}
	if len(written) > 0 {
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(written, ", ")); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `DO $$ DECLARE s regclass; BEGIN
		FOR s IN SELECT format('%I.%I', schemaname, sequencename)::regclass FROM pg_sequences WHERE last_value IS NOT NULL LOOP
			EXECUTE format('ALTER SEQUENCE %s RESTART', s);
		END LOOP; END $$`); err != nil {
		return err
	}
	var (
		fp       string
		catalogs bool
	)
	if err := tx.QueryRow(ctx, fingerprintSQL).Scan(&fp); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, writtenSinceSQL, db.since).Scan(&catalogs); err != nil {
		return err
	}
	if fp != p.fingerprint {
		return fmt.Errorf("%w: catalogs hold %s rows, its template %s", errNotPristine, fp, p.fingerprint)
	}
	if catalogs {
		return fmt.Errorf("%w: a catalog row was written", errNotPristine)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_stat_reset()`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
