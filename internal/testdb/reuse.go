package testdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
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
//   - A database is offered again only when it is as the test got it:
//     no catalog written since the test got it (any CREATE, ALTER, DROP,
//     COMMENT or GRANT writes one; the same statistics count it) but the
//     statistics of tables it wrote (autovacuum analyzes those; they go
//     with the rows), the same number of rows in the main catalogs, no
//     other table vacuumed or analyzed (either sets pg_class's planner
//     statistics in place), every sequence unused, no row changed in a
//     table the template filled, and no connection left. Anything else
//     and it is dropped as before.
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
// were cloned from template. It carries the version of the emptying below,
// so a database an older version offered is never claimed (stop drops it).
func freePrefix(template string) string {
	return freeFamily(template) + "_"
}

// freeFamily is the name prefix of the offered clones of every template
// whose name starts with templatePrefix (ffr_tmpl_, ffr_fftmpl_).
func freeFamily(templatePrefix string) string {
	return "ffr_f_v2_" + strings.TrimPrefix(templatePrefix, "ffr_")
}

// pristine is what this process knows of a template's clones untouched:
// the tables the template filled, recorded in the template's comment when
// it was built (templateComment) or, for a template without that record,
// read once per process from a new clone.
type pristine struct {
	disabled bool // the server's statistics cannot tell what a test wrote
	filled   map[uint32]bool
}

// baseline is one test database as the test got it, read when it got it:
// what it must be again to be offered. (Not the template's, read once: a
// clone made after autovacuum analyzed the template's catalogs holds more
// statistics rows than one made before.)
type baseline struct {
	fingerprint string
	statted     int64 // tables with planner statistics set
}

var (
	pristineMu sync.Mutex
	pristines  = map[string]*pristine{}
)

// fingerprintSQL counts the rows of the catalogs a CREATE or DROP of a
// table, index, sequence, type, function, constraint, trigger, comment or
// statistic changes, the database's own settings (pg_db_role_setting is
// shared: its changes are not counted in the database's statistics) and the
// sequences used: a second net under writesSQL's count of catalog writes.
// (pg_attribute and pg_depend, eight times the rest together, are left out:
// whatever adds or removes their rows adds or removes rows counted here.)
const fingerprintSQL = `
SELECT concat_ws(' ',
  (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_namespace), (SELECT count(*) FROM pg_proc),
  (SELECT count(*) FROM pg_type), (SELECT count(*) FROM pg_constraint), (SELECT count(*) FROM pg_trigger),
  (SELECT count(*) FROM pg_attrdef), (SELECT count(*) FROM pg_description), (SELECT count(*) FROM pg_statistic),
  (SELECT count(*) FROM pg_rewrite), (SELECT count(*) FROM pg_sequence), (SELECT count(*) FROM pg_default_acl),
  (SELECT count(*) FROM pg_policy), (SELECT count(*) FROM pg_extension),
  (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
  (SELECT count(*) FROM pg_sequences WHERE last_value IS NOT NULL))`

// writesSQL reads the database's cumulative statistics, which count every
// row a table had inserted, updated or deleted since they were last reset
// (when the database was offered; a new database starts at zero), catalogs
// included: the user tables written (with their oids), the number of
// catalogs written (any DDL, GRANT, COMMENT or ANALYZE writes one; shared
// catalogs are left out, their counts are the whole server's), and the
// number of user tables not written whose planner statistics are set (a
// VACUUM or ANALYZE sets them in place, counted nowhere else; a TRUNCATE
// puts a written table's back as CREATE left them). One pass over pg_class,
// no table opened.
const writesSQL = `
SELECT COALESCE(array_agg(c.oid) FILTER (WHERE c.oid >= 16384 AND c.relkind = 'r' AND w.written), '{}'),
       COALESCE(array_agg(c.oid::regclass::text) FILTER (WHERE c.oid >= 16384 AND c.relkind = 'r' AND w.written), '{}'),
       COALESCE(array_agg(c.relname::text) FILTER (WHERE c.relnamespace = 'pg_catalog'::regnamespace AND NOT c.relisshared AND w.written), '{}'),
       count(*) FILTER (WHERE c.oid >= 16384 AND NOT w.written AND (c.reltuples >= 0 OR c.relpages > 0 OR c.relallvisible > 0))
  FROM pg_class c,
       LATERAL (SELECT pg_stat_get_tuples_inserted(c.oid) + pg_stat_get_tuples_updated(c.oid)
                     + pg_stat_get_tuples_deleted(c.oid) > 0 AS written) w
 WHERE c.relkind IN ('r', 't')`

// pristineKnown reports whether this process has read what template's
// clones look like untouched, and may reuse them.
func pristineKnown(template string) bool {
	pristineMu.Lock()
	defer pristineMu.Unlock()
	p := pristines[template]
	return p != nil && !p.disabled
}

// readPristine records, once per process and template, which tables
// template filled, from db, a new clone. It reports whether databases of
// template can be reused: not where the server does not count what tests
// write (track_counts off).
func readPristine(ctx context.Context, template string, db *DB) bool {
	pristineMu.Lock()
	defer pristineMu.Unlock()
	if p := pristines[template]; p != nil {
		return !p.disabled
	}
	p, err := readFilled(ctx, db.Pool)
	if err != nil {
		p = &pristine{disabled: true}
	}
	pristines[template] = p
	return !p.disabled
}

// querier is what readFilled needs of a pool or a connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readFilled reads, from an untouched clone of a template or the template
// itself as it is built, which tables hold rows. An error when the server
// does not count what tests write (track_counts off).
func readFilled(ctx context.Context, q querier) (*pristine, error) {
	if err := trackingCounts(ctx, q); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT oid FROM pg_class WHERE relkind = 'r'
		AND relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace) AND pg_relation_size(oid) > 0`)
	if err != nil {
		return nil, fmt.Errorf("tables with rows: %w", err)
	}
	filled, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, fmt.Errorf("tables with rows: %w", err)
	}
	p := &pristine{filled: map[uint32]bool{}}
	for _, o := range filled {
		p.filled[o] = true
	}
	return p, nil
}

// trackingCounts returns an error unless the server counts the rows each
// table has written (track_counts), which emptying reads.
func trackingCounts(ctx context.Context, q querier) error {
	var tracking string
	if err := q.QueryRow(ctx, `SELECT current_setting('track_counts')`).Scan(&tracking); err != nil {
		return err
	}
	if tracking != "on" {
		return fmt.Errorf("track_counts is %s", tracking)
	}
	return nil
}

// templateComment is a template database's comment: when it was last used
// (read by dropStaleTemplates) and the oids of the tables it holds rows in,
// read as it was built, so that a test process may claim an offered clone
// from its first test on: without the record, each test process cloned
// a database of its own first to read them (with four tests starting at
// once, up to four): 58 clones of the 256-partition templates a run, 39
// with it.
const templateComment = "ffreconcile test template, last used %d, filled oids: %s"

// formatFilled writes p's tables for templateComment.
func formatFilled(p *pristine) string {
	oids := make([]string, 0, len(p.filled))
	for o := range p.filled {
		oids = append(oids, strconv.FormatUint(uint64(o), 10))
	}
	slices.Sort(oids)
	return strings.Join(oids, " ")
}

// parseFilled reads the tables templateComment records; nil for a comment
// without the record (a template built by an older version, or by a
// process that could not read it: "unknown").
func parseFilled(comment string) *pristine {
	_, list, found := strings.Cut(comment, ", filled oids: ")
	if !found {
		return nil
	}
	p := &pristine{filled: map[uint32]bool{}}
	for _, f := range strings.Fields(list) {
		o, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil
		}
		p.filled[uint32(o)] = true
	}
	return p
}

// knowPristine records p as what template's clones look like untouched,
// unless this process knows already.
func knowPristine(template string, p *pristine) {
	pristineMu.Lock()
	defer pristineMu.Unlock()
	if pristines[template] == nil {
		pristines[template] = p
	}
}

// readBaseline reads db as the test gets it, which must be as untouched:
// its statistics count no row written.
func readBaseline(ctx context.Context, db *DB) (*baseline, error) {
	b := &baseline{}
	if err := db.Pool.QueryRow(ctx, fingerprintSQL).Scan(&b.fingerprint); err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	var (
		oids             []uint32
		tables, catalogs []string
	)
	if err := db.Pool.QueryRow(ctx, writesSQL).Scan(&oids, &tables, &catalogs, &b.statted); err != nil {
		return nil, fmt.Errorf("statistics: %w", err)
	}
	// Autovacuum may analyze a catalog of an offered database (the
	// emptying's TRUNCATEs rewrite pg_class rows by the hundred) after its
	// counts were reset: pg_statistic written, counted here, seen once in
	// a loaded suite. That changes no table of the test's; the
	// fingerprint, pg_statistic's row count included, is read after it.
	if len(oids) > 0 || (len(catalogs) > 0 && !slices.Equal(catalogs, []string{"pg_statistic"})) {
		return nil, fmt.Errorf("tables %v and catalogs %v written before the test got it", tables, catalogs)
	}
	return b, nil
}

// claim renames a database offered for reuse from template to a new test
// database name, returning "" when there is none.
func claim(ctx context.Context, admin *pgx.Conn, template string) string {
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, freePrefix(template))
	if err != nil {
		return ""
	}
	free, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return ""
	}
	for _, f := range free {
		name := newName()
		// Fails when another test binary claimed it first.
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{f}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err == nil {
			return name
		}
	}
	return ""
}

// release empties db, whose pool is closed, and offers it for reuse, or
// drops it when it cannot be shown to be as the test got it (see the
// comment at the top of this file). One admin connection serves the wait
// for the test's connections, the rename and the drop.
func release(db *DB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return // nor could it be dropped; the next run's sweep drops it
	}
	defer admin.Close(ctx)
	err = empty(ctx, admin, db)
	if err == nil {
		free := freePrefix(db.template) + randomSuffix()
		if _, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" RENAME TO "+pgx.Identifier{free}.Sanitize()); err == nil {
			trace(db.test, "offered", db.Name, free)
			return
		}
	}
	trace(db.test, "dropped", db.Name, err.Error())
	dropOn(ctx, admin, db.Name)
}

// errNotPristine says a database is not as its test got it.
var errNotPristine = errors.New("not as the test got it")

// empty truncates the tables the test wrote and restarts the sequences it
// used, in one transaction committed only when the database is then as the
// test got it.
func empty(ctx context.Context, admin *pgx.Conn, db *DB) error {
	name := db.Name
	pristineMu.Lock()
	p := pristines[db.template]
	pristineMu.Unlock()
	if p == nil || p.disabled || db.baseline == nil {
		return fmt.Errorf("%w: no record of it as the test got it", errNotPristine)
	}
	b := db.baseline
	// The test's pools are closed; their backends end within moments.
	for i := 0; ; i++ {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if i == 100 {
			return fmt.Errorf("%d connections left", n)
		}
		time.Sleep(20 * time.Millisecond)
	}

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
	// (track_counts is on: readPristine checked, once per process.)
	var (
		oids             []uint32
		tables, catalogs []string
		statted          int64
	)
	if err := tx.QueryRow(ctx, writesSQL).Scan(&oids, &tables, &catalogs, &statted); err != nil {
		return err
	}
	// Autovacuum analyzes a table a test filled (its threshold is 50 rows
	// for a table never analyzed): the statistics of tables emptied below
	// go with their rows; the count of pg_statistic's rows then tells
	// whether any other was written.
	if len(catalogs) > 0 && !slices.Equal(catalogs, []string{"pg_statistic"}) {
		return fmt.Errorf("%w: catalogs written: %s", errNotPristine, strings.Join(catalogs, ", "))
	}
	if statted != b.statted {
		return fmt.Errorf("%w: %d tables vacuumed or analyzed", errNotPristine, statted-b.statted)
	}
	for i, o := range oids {
		if p.filled[o] {
			return fmt.Errorf("%w: %s written", errNotPristine, tables[i])
		}
	}
	if len(tables) > 0 {
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM pg_statistic WHERE starelid = ANY($1::oid[])`, oids); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `DO $$ DECLARE s regclass; BEGIN
		FOR s IN SELECT format('%I.%I', schemaname, sequencename)::regclass FROM pg_sequences WHERE last_value IS NOT NULL LOOP
			EXECUTE format('ALTER SEQUENCE %s RESTART', s);
		END LOOP; END $$`); err != nil {
		return err
	}
	var fp string
	if err := tx.QueryRow(ctx, fingerprintSQL).Scan(&fp); err != nil {
		return err
	}
	if fp != b.fingerprint {
		return fmt.Errorf("%w: catalogs hold %s rows, %s when the test got it", errNotPristine, fp, b.fingerprint)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	// The counts start again from zero for the next test, once this
	// session's own (the TRUNCATE's catalog writes) are reported: a
	// session reports them when it goes idle, at once when told to.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SELECT pg_stat_reset()`)
	return err
}
