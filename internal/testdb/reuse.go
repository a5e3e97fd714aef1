package testdb

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reuse. A clone of the template is ~10,000 relations (12 tables × 256
// partitions and their indexes, 126 MB): CREATE DATABASE copies it in about
// 5 s on an idle 2-core machine, while emptying one takes a fraction of a
// second. So, as River's riverdbtest reuses test schemas, a database whose
// test has ended is emptied and handed to the next test of the same process
// asking for the same template. It is dropped instead when its test changed
// its catalog (digest differs from a fresh clone's), or left more rows than
// a test of behaviour does (the planner's statistics would then differ from
// a fresh clone's), or when emptying it fails.
//
// Spares live in the test binary's memory: a package opts in with Main,
// which drops them when its tests are done; without Main every database is
// dropped when its test ends. Databases are named ffr_t_<pid>_<random>, and
// the first database a process creates drops those of processes no longer
// running (a test binary killed before Main could clean up).

// maxReusedRows is the most rows a released database may hold to be
// reused.
const maxReusedRows = 1000

var (
	reuseOn bool // set by Main
	spares  = struct {
		sync.Mutex
		byTemplate map[string][]string // template → clean databases
		digest     map[string]string   // template → catalog digest of a fresh clone
	}{byTemplate: map[string][]string{}, digest: map[string]string{}}
	sweepOnce sync.Once
)

// Main runs m's tests with database reuse on, then drops the spare
// databases, and exits with m's code. Call it from a package's TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit, for a TestMain with more to do.
func Run(m *testing.M) int {
	reuseOn = true
	code := m.Run()
	spares.Lock()
	defer spares.Unlock()
	for tmpl, names := range spares.byTemplate {
		for _, name := range names {
			dropDatabase(name)
		}
		delete(spares.byTemplate, tmpl)
	}
	return code
}

// takeSpare returns a clean database cloned from template, if there is one.
func takeSpare(template string) (string, bool) {
	spares.Lock()
	defer spares.Unlock()
	names := spares.byTemplate[template]
	if len(names) == 0 {
		return "", false
	}
	name := names[len(names)-1]
	spares.byTemplate[template] = names[:len(names)-1]
	return name, true
}

// release empties name, cloned from template, and keeps it as a spare, or
// drops it (see Reuse).
func release(name, template string) {
	if !reuseOn || template == "" {
		dropDatabase(name)
		return
	}
	if err := empty(name, template); err != nil {
		dropDatabase(name)
		return
	}
	spares.Lock()
	spares.byTemplate[template] = append(spares.byTemplate[template], name)
	spares.Unlock()
}

// empty checks that name's catalog is still its template's and deletes every
// row of its tables (River's migration records aside), restarting its
// sequences, as one transaction.
func empty(name, template string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := WithDatabase(AdminURL(), name)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// A process the test started (a worker binary) may still be
	// connected: it must not write into the next test's rows.
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		return err
	}
	var digest string
	if err := conn.QueryRow(ctx, catalogDigestSQL).Scan(&digest); err != nil {
		return err
	}
	spares.Lock()
	want := spares.digest[template]
	spares.Unlock()
	if digest != want {
		return fmt.Errorf("catalog of %s changed", name)
	}
	rows, err := conn.Query(ctx, `
		SELECT c.oid::regclass::text FROM pg_class c
		 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
		   AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace, 'pg_toast'::regnamespace)
		   AND c.relname <> 'river_migration'`)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Replica mode skips triggers and foreign-key checks: rows go in
		// any order and no NOTIFY is sent for them.
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		var deleted int64
		for _, t := range tables {
			tag, err := tx.Exec(ctx, "DELETE FROM "+t)
			if err != nil {
				return err
			}
			deleted += tag.RowsAffected()
		}
		if deleted > maxReusedRows {
			return fmt.Errorf("%s held %d rows", name, deleted)
		}
		_, err := tx.Exec(ctx, `SELECT setval(c.oid, s.seqstart, false) FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid`)
		return err
	})
}

// catalogDigestSQL digests what a test could change in a database's schema:
// its relations, the columns of its tables, triggers, constraints,
// functions (with their bodies), comments (with their text: the promote
// function's version is its comment), schemas, extensions and per-database
// settings.
// Partitions are covered by their names and column counts; their columns
// follow their parent's.
const catalogDigestSQL = `
WITH rel AS (
    SELECT c.oid, n.nspname, c.relname, c.relkind, c.relnatts, c.relispartition
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
)
SELECT md5(concat_ws('|',
    (SELECT string_agg(format('%s.%s:%s%s', nspname, relname, relkind, relnatts), ',' ORDER BY nspname, relname) FROM rel),
    (SELECT string_agg(format('%s.%s:%s%s%s%s', r.relname, a.attname, a.atttypid, a.attnotnull, a.attisdropped, a.atthasdef), ','
                       ORDER BY r.nspname, r.relname, a.attnum)
       FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid
      WHERE r.relkind IN ('r', 'p') AND NOT r.relispartition AND a.attnum > 0),
    (SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger WHERE NOT tgisinternal),
    (SELECT count(*) FROM pg_constraint),
    (SELECT string_agg(proname || md5(prosrc), ',' ORDER BY proname, md5(prosrc)) FROM pg_proc
      WHERE pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)),
    (SELECT md5(string_agg(description, ',' ORDER BY objoid, classoid, objsubid)) FROM pg_description),
    (SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace),
    (SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension),
    (SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database())))`

// recordDigest stores the catalog digest of name, a fresh clone of
// template, once per template: what a released clone must still have.
func recordDigest(ctx context.Context, name, template string) error {
	spares.Lock()
	_, ok := spares.digest[template]
	spares.Unlock()
	if ok || !reuseOn {
		return nil
	}
	u, err := WithDatabase(AdminURL(), name)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var digest string
	if err := conn.QueryRow(ctx, catalogDigestSQL).Scan(&digest); err != nil {
		return fmt.Errorf("catalog digest: %w", err)
	}
	spares.Lock()
	spares.digest[template] = digest
	spares.Unlock()
	return nil
}

// newName names a test database after this process, so that a later
// process can tell its leftovers (see sweepDead).
func newName() string {
	return fmt.Sprintf("ffr_t_%d_%s", os.Getpid(), randomSuffix())
}

// sweepDead drops, once per process, the test databases of processes no
// longer running on this machine, left behind by a test binary that was
// killed. Databases someone is connected to are left alone.
func sweepDead(ctx context.Context, admin *pgx.Conn) {
	sweepOnce.Do(func() {
		rows, err := admin.Query(ctx, `SELECT datname FROM pg_database d WHERE starts_with(datname, 'ffr_t_')
			 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`)
		if err != nil {
			return
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return
		}
		for _, name := range names {
			if pidAlive(name) {
				continue
			}
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
		}
	})
}

// pidAlive reports whether the process that named a test database
// ffr_t_<pid>_<random> is still running; a name of another form (an older
// version's) counts as dead.
func pidAlive(name string) bool {
	rest, ok := strings.CutPrefix(name, "ffr_t_")
	if !ok {
		return false
	}
	pidText, _, ok := strings.Cut(rest, "_")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
