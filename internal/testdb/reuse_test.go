package testdb

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestEmptyOffersOnlyWhatItCanClean: a database a test wrote rows into
// (partitions, River's jobs, sequences) is emptied back to its template's
// state; one whose catalogs, statistics, settings or template rows the test
// changed is refused, and so is one a connection is still open to. A
// regression shows as a later test seeing an earlier test's rows or objects
// (a case below emptied), or as no database ever reused (the first case
// refused).
func TestEmptyOffersOnlyWhatItCanClean(t *testing.T) {
	t.Parallel()
	const insertExecs = `INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
		eligibility_state, public_state, attempt_state, created_at_ms)
		SELECT (g % 256)::smallint, gen_random_uuid(), 'l', 'active', 'leased', 'not_applicable', 'running', 'running_attempt', 1
		FROM generate_series(1, 300) g`
	for _, tt := range []struct {
		name  string
		stmts []string
		open  bool   // keep a connection open
		want  string // "" when emptied, else in the error
	}{
		{name: "NothingWritten"},
		{name: "RowsJobsAndSequences", stmts: []string{
			insertExecs,
			`INSERT INTO ff_lease_event (execution_id, partition_key, event_type, occurred_at_ms) VALUES ('x', 3, 'expired', 1)`,
			`INSERT INTO river.river_job (kind, args, queue, state, max_attempts) VALUES ('k', '{}', 'q', 'available', 1)`,
			`DELETE FROM ff_exec_core WHERE partition_key < 10`,
		}},
		{name: "TableCreated", stmts: []string{`CREATE TABLE made_by_a_test (x int)`}, want: "catalogs written: "},
		{name: "IndexDropped", stmts: []string{`DROP INDEX ffreconcile_exec_core_ended_idx`}, want: "catalogs written: "},
		{name: "Commented", stmts: []string{`COMMENT ON TABLE ff_attempt IS 'x'`}, want: "catalogs written: "},
		{name: "ColumnDefaultChanged", stmts: []string{`ALTER TABLE ff_attempt ALTER COLUMN lease_epoch SET DEFAULT 7`}, want: "catalogs written: "},
		{name: "ColumnDropped", stmts: []string{`ALTER TABLE ff_attempt DROP COLUMN outcome`}, want: "catalogs written: "},
		{name: "Granted", stmts: []string{`GRANT SELECT ON ff_attempt TO PUBLIC`}, want: "catalogs written: "},
		{name: "Analyzed", stmts: []string{insertExecs, `ANALYZE ff_exec_core`}, want: "vacuumed or analyzed"}, // its empty partitions too
		{name: "PartitionsAnalyzed", stmts: []string{insertExecs, `DO $$ DECLARE p regclass; BEGIN
			FOR p IN SELECT DISTINCT tableoid::regclass FROM ff_exec_core LIMIT 3 LOOP EXECUTE format('ANALYZE %s', p); END LOOP; END $$`}},
		{name: "EmptyTableAnalyzed", stmts: []string{`ANALYZE ff_attempt_p0`}, want: "vacuumed or analyzed"},
		{name: "EmptyTableVacuumed", stmts: []string{`VACUUM ff_attempt_p0`}, want: "vacuumed or analyzed"},
		{name: "TemplateRowsChanged", stmts: []string{`DELETE FROM river.river_migration WHERE version = (SELECT max(version) FROM river.river_migration)`}, want: "river_migration written"},
		{name: "DatabaseSetting", stmts: []string{`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET work_mem = ''8MB''', current_database()); END $$`}, want: "catalogs hold"},
		{name: "TempTable", stmts: []string{`CREATE TEMP TABLE scratch (x int)`}, want: "catalogs written: "},
		{name: "ConnectionLeftOpen", open: true, want: "connections left"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := createReusing(t, ctx, schemaTemplate(t, ctx), true)
			if db.baseline == nil {
				t.Fatalf("%s is not reusable from the start (its log line says why)", db.Name)
			}
			admin, err := pgx.Connect(ctx, AdminURL())
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			// An emptied database is emptied again after a second
			// test's writes: the first emptying's own catalog writes
			// (its TRUNCATE's) must not count against it.
			for round := 1; round <= 2; round++ {
				if round > 1 {
					pool, err := pgxpool.New(ctx, db.URL)
					if err != nil {
						t.Fatal(err)
					}
					db.Pool = pool
				}
				for _, s := range tt.stmts {
					if _, err := db.Pool.Exec(ctx, s); err != nil {
						t.Fatalf("%s: %v", s, err)
					}
				}
				if tt.open {
					conn, err := pgx.Connect(ctx, db.URL)
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close(ctx)
				}
				db.Pool.Close()

				err := empty(ctx, admin, db)
				if tt.want != "" {
					if err == nil || !strings.Contains(err.Error(), tt.want) {
						t.Fatalf("empty = %v; want an error saying %q", err, tt.want)
					}
					return
				}
				if err != nil {
					t.Fatalf("round %d: empty: %v", round, err)
				}
				checkEmptied(t, db)
			}
		})
	}
}

// checkEmptied fails t unless db holds no row a test wrote and its catalogs
// are as its template left them.
func checkEmptied(t *testing.T, db *DB) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var execs, events, jobs, sequences int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM ff_exec_core), (SELECT count(*) FROM ff_lease_event),
				(SELECT count(*) FROM river.river_job), (SELECT count(*) FROM pg_sequences WHERE last_value IS NOT NULL)`).
		Scan(&execs, &events, &jobs, &sequences); err != nil {
		t.Fatal(err)
	}
	if execs+events+jobs+sequences != 0 {
		t.Fatalf("after empty: %d executions, %d lease events, %d River jobs, %d sequences used; want none", execs, events, jobs, sequences)
	}
	var fp string
	if err := conn.QueryRow(ctx, fingerprintSQL).Scan(&fp); err != nil {
		t.Fatal(err)
	}
	if want := db.baseline.fingerprint; fp != want {
		t.Fatalf("after empty the catalogs hold %s rows; %s when the test got it", fp, want)
	}
}

// TestClaimGivesAnOfferedDatabaseToOneClaimant: claimants racing for one
// offered database (several test binaries ask for a clone at once) get it
// once; the others get nothing and clone. A regression shows as two tests
// sharing a database.
func TestClaimGivesAnOfferedDatabaseToOneClaimant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A template name of this test's own, so no other test binary claims
	// the offered database.
	template := "ffr_tmpl_claim_" + randomSuffix()
	offered := NewEmpty(t)
	offered.Pool.Close()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	free := freePrefix(template) + randomSuffix()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{offered.Name}.Sanitize()+" RENAME TO "+pgx.Identifier{free}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		claims []string
	)
	for range 4 {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, AdminURL())
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			if name := claim(ctx, conn, template); name != "" {
				mu.Lock()
				claims = append(claims, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, n := range claims {
		dropDatabase(n)
	}
	if len(claims) != 1 {
		t.Fatalf("claims %v; want exactly one", claims)
	}
	var left bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE starts_with(datname, $1))`, freePrefix(template)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Fatal("the offered database is still offered after it was claimed")
	}
}

// TestBaselineTakesAnAnalyzedCatalog: a database whose catalogs autovacuum
// analyzed before the test got it (pg_statistic written, nothing else) is
// taken as it is, its statistics' row count in the baseline; one with a
// table written is not. A regression shows as a test refused a reusable
// database by chance (a loaded suite once failed
// TestEmptyOffersOnlyWhatItCanClean so), or as a database with an earlier
// test's rows handed on.
func TestBaselineTakesAnAnalyzedCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := createReusing(t, ctx, schemaTemplate(t, ctx), true)
	if db.baseline == nil {
		t.Fatalf("%s is not reusable from the start (its log line says why)", db.Name)
	}
	// written runs stmt on a connection of its own and returns once the
	// server counts what it wrote: a backend reports its counts before it
	// leaves pg_stat_activity.
	written := func(stmt string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		conn.Close(ctx)
		for i := 0; ; i++ {
			var left bool
			if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if !left {
				return
			}
			if i == 500 {
				t.Fatalf("backend %d still there after 10 s", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	written(`ANALYZE pg_catalog.pg_class`) // as autovacuum does
	b, err := readBaseline(ctx, db)
	if err != nil {
		t.Fatalf("baseline after a catalog analyzed: %v; want it taken", err)
	}
	if b.fingerprint != db.baseline.fingerprint {
		t.Logf("the analyze changed pg_statistic's row count: %s → %s", db.baseline.fingerprint, b.fingerprint)
	}
	written(`INSERT INTO ff_lease_event (execution_id, partition_key, event_type, occurred_at_ms) VALUES ('x', 3, 'expired', 1)`)
	if _, err := readBaseline(ctx, db); err == nil || !strings.Contains(err.Error(), "written before the test got it") {
		t.Fatalf("baseline after a row written: %v; want it refused", err)
	}
}

// TestANewTemplateDropsTheOldOnesClones: building the template of a new
// DDL version drops the templates of its family unused for templateIdle
// and the clones offered for reuse of every template not kept (an idle
// one's, a vanished one's), and keeps a template of another version used
// recently with its clones, and another family's. A regression shows as a
// test cluster growing by a pool of ~200 MB databases with every schema
// change (four development clusters in /dev/shm once filled the machine's
// RAM so), or as two checkouts sharing a server through TEST_DATABASE_URL
// dropping each other's templates under their running tests ("template
// database ... does not exist").
func TestANewTemplateDropsTheOldOnesClones(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Prefixes of this test's own, so no other test's templates are touched.
	prefix := "ffr_tmplgc" + randomSuffix() + "_"
	other := "ffr_tmplgcother" + randomSuffix() + "_"
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	noMigration := func(context.Context, string) error { return nil }

	old, err := ensureTemplate(ctx, prefix, "old", noMigration)
	if err != nil {
		t.Fatal(err)
	}
	recent, err := ensureTemplate(ctx, prefix, "recent", noMigration)
	if err != nil {
		t.Fatal(err)
	}
	// old was last used long ago.
	if _, err := admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{old}.Sanitize()+" IS 'ffreconcile test template, last used 1'"); err != nil {
		t.Fatal(err)
	}
	oldClone := freePrefix(old) + randomSuffix()
	recentClone := freePrefix(recent) + randomSuffix()
	goneClone := freePrefix(prefix+"gone") + randomSuffix()
	otherClone := freePrefix(other+"v1") + randomSuffix()
	for _, name := range []string{oldClone, recentClone, goneClone, otherClone} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	newer, err := ensureTemplate(ctx, prefix, "new", noMigration)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{old, recent, oldClone, recentClone, goneClone, otherClone, newer} {
			dropDatabase(name)
		}
	})

	exists := func(name string) bool {
		var ok bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for name, want := range map[string]bool{
		old: false, oldClone: false, goneClone: false,
		recent: true, recentClone: true, newer: true, otherClone: true,
	} {
		if got := exists(name); got != want {
			t.Errorf("database %s exists: %v; want %v", name, got, want)
		}
	}
}

// TestTemplateRecordsWhatItsClonesHold: the tables a template's comment
// records as filled (read by every test process instead of cloning a
// database of its own) are those an untouched clone holds rows in; a
// comment without the record (an older version's, or "unknown") gives
// none, so the process reads them from a clone as before. A regression
// (a record read before the migration's last rows, or from the wrong
// database) would let emptying truncate, or keep, the wrong tables.
func TestTemplateRecordsWhatItsClonesHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	template := schemaTemplate(t, ctx)
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var comment string
	if err := admin.QueryRow(ctx, `SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1`, template).Scan(&comment); err != nil {
		t.Fatal(err)
	}
	recorded := parseFilled(comment)
	if recorded == nil || len(recorded.filled) == 0 {
		t.Fatalf("template %s comment %q records no filled tables", template, comment)
	}
	fresh := createReusing(t, ctx, template, false)
	read, err := readFilled(ctx, fresh.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := formatFilled(recorded), formatFilled(read); got != want {
		t.Errorf("template records filled tables %s; an untouched clone holds rows in %s", got, want)
	}
	for _, c := range []string{"", "ffreconcile test template, last used 1", "ffreconcile test template, last used 1, filled oids: unknown"} {
		if p := parseFilled(c); p != nil {
			t.Errorf("parseFilled(%q) = %v; want nil (unknown)", c, p.filled)
		}
	}
}
