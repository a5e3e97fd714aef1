// Package testdb gives each test its own real PostgreSQL database, migrated
// with River's tables and the 256-partition ff_* schema.
//
// Creating 12 tables × 256 partitions takes many seconds, so the schema is
// built once into a template database (named after the DDL's fingerprint, so
// a DDL change rebuilds it) and tests get clones of it (CREATE DATABASE …
// TEMPLATE, a file copy), each dropped when its test ends (see cleanup.go)
// or, with reuse, emptied and handed to a later test (see reuse.go).
//
// The server is TEST_DATABASE_URL, else DATABASE_URL, else
// dbconn.DefaultAdminURL (the local server, without TLS).
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
)

// RiverSchema is the schema River's tables live in inside test databases.
const RiverSchema = jobs.DefaultRiverSchema

// AdminURL is the URL of the server's maintenance database used to create
// and drop test databases.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return dbconn.DefaultAdminURL
}

// WithDatabase returns base with its database name replaced by name.
func WithDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		// Key/value DSN: a later dbname overrides an earlier one.
		return base + " dbname=" + name, nil
	}
	u.Path = "/" + name
	return u.String(), nil
}

// A template database per schema flavour, built once per process.
var (
	templateOnce sync.Once
	templateName string
	templateErr  error

	ffTemplateOnce sync.Once
	ffTemplateName string
	ffTemplateErr  error
)

// DB is one test database.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool

	// With reuse (see reuse.go): the template it is a clone of, and what
	// it looked like when the test got it.
	template string
	baseline *baseline
	test     string // the test's name, for trace
}

// New creates a fresh database for t, migrated with River (schema
// RiverSchema) and the ff_* tables, and drops it when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The template has no open connections (ensureTemplate closes its own), so
	// many tests may clone it at once.
	return create(t, ctx, schemaTemplate(t, ctx))
}

// schemaTemplate returns the name of the template New clones, building it once
// per server and DDL version.
func schemaTemplate(t testing.TB, ctx context.Context) string {
	t.Helper()
	templateOnce.Do(func() {
		fp := sha256.Sum256([]byte(migrations.Fingerprint() + "\n" + templateRecipe))
		templateName, templateErr = ensureTemplate(ctx, "ffr_tmpl_", hex.EncodeToString(fp[:])[:12], migrateInto)
	})
	if templateErr != nil {
		t.Fatalf("testdb: build template database: %v", templateErr)
	}
	return templateName
}

// NewEmpty creates a database with nothing in it (no River, no ff tables)
// and drops it when t ends.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return create(t, ctx, "")
}

// create gives t a new database cloned from template (empty when template
// is ""), named ffr_t_<pid>_<random>, with a pool on it; both are closed
// and dropped when t ends.
func create(t testing.TB, ctx context.Context, template string) *DB {
	t.Helper()
	return createReusing(t, ctx, template, template != "" && reuseEnabled())
}

// createReusing is create, reusing databases (reuse.go) when reuse is set.
func createReusing(t testing.TB, ctx context.Context, template string, reuse bool) *DB {
	t.Helper()
	// A process claims an offered clone once it knows what the
	// template's clones look like untouched: from the template's comment
	// (ensureTemplate), else from a clone of its own (readPristine).
	claimFirst := reuse && pristineKnown(template)
	for {
		name, claimed := clone(t, ctx, template, claimFirst)
		dbURL, err := WithDatabase(AdminURL(), name)
		if err != nil {
			dropDatabase(name)
			t.Fatal(err)
		}
		// Opened as the fleet opens its pools (JIT off, among others).
		pool, err := dbconn.Open(ctx, dbURL, dbconn.Options{})
		if err != nil {
			dropDatabase(name)
			t.Fatalf("testdb: %v", err)
		}
		db := &DB{Name: name, URL: dbURL, Pool: pool, template: template, test: t.Name()}
		if claimed {
			trace(t.Name(), "claimed", name, template)
		} else {
			trace(t.Name(), "cloned", name, template)
		}
		if reuse && readPristine(ctx, template, db) {
			if db.baseline, err = readBaseline(ctx, db); err != nil && claimed {
				// Not as it was offered: no test gets it.
				t.Logf("testdb: claimed %s, then dropped it: %v", name, err)
				trace(t.Name(), "dropped", name, "claimed, not as offered: "+err.Error())
				pool.Close()
				dropDatabase(name)
				claimFirst = false
				continue
			}
			if err != nil {
				t.Logf("testdb: %s will not be reused: %v", name, err)
			}
		}
		// Without a baseline, the database is dropped as without reuse.
		reused := db.baseline != nil
		t.Cleanup(func() {
			pool.Close()
			if reused {
				release(db)
			} else {
				trace(db.test, "dropped", name, "no baseline")
				dropDatabase(name)
			}
		})
		return db
	}
}

// clone creates a new database from template, or with claimFirst claims one
// emptied by an earlier test when there is one (see reuse.go); claimed
// says which.
func clone(t testing.TB, ctx context.Context, template string, claimFirst bool) (name string, claimed bool) {
	t.Helper()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("testdb: connect to %s: %v", redactedAdmin(), err)
	}
	defer admin.Close(ctx)
	sweepDead(ctx, admin)
	if claimFirst {
		if name := claim(ctx, admin, template); name != "" {
			return name, true
		}
	}
	name = newName()
	options := ""
	if template != "" {
		options = " TEMPLATE " + pgx.Identifier{template}.Sanitize()
		// PostgreSQL 15's default WAL_LOG strategy writes each of the
		// template's ~25,000 mostly empty relations through WAL; copying
		// the files takes half the time (2.7 s against 1.4 s a clone on
		// tmpfs), and its checkpoints cost little with fsync off.
		if fileCopyStrategy(admin) {
			options += " STRATEGY FILE_COPY"
		}
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+options); err != nil {
		t.Fatalf("testdb: create database %s: %v", name, err)
	}
	return name, false
}

// fileCopyStrategy reports whether CREATE DATABASE on admin's server takes
// a STRATEGY (PostgreSQL 15 and later).
func fileCopyStrategy(admin *pgx.Conn) bool {
	// server_version is reported at connect, e.g. "15.19 (Debian 15.19-0+deb12u1)".
	major, _, _ := strings.Cut(admin.PgConn().ParameterStatus("server_version"), ".")
	v, err := strconv.Atoi(strings.TrimSpace(major))
	return err == nil && v >= 15
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	dropOn(ctx, admin, name)
}

// dropOn drops the database name through admin, ending its connections.
func dropOn(ctx context.Context, admin *pgx.Conn, name string) {
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Schemas are the two ways a test database's ff_* tables come to be: this
// project's --ff-schema (New) and FlowFabric's own migrations
// (NewFlowFabric, which skips the test, saying why, when they are not
// beside the clone). An end-to-end test runs on both, so the worker is
// shown to run unchanged on a database FlowFabric migrated.
var Schemas = []struct {
	Name string
	New  func(testing.TB) *DB
}{
	{"FFSchema", New},
	{"FlowFabricMigrations", NewFlowFabric},
}

// NewFlowFabric creates a database migrated the way a FlowFabric deployment
// is: FlowFabric's own migrations (see FlowFabricMigrations), applied in name
// order, then River's tables and the worker table, as `worker migrate`
// without --ff-schema adds them. It drops the database when t ends, and
// skips t, saying why, when FlowFabric's migrations are not beside the
// clone.
func NewFlowFabric(t testing.TB) *DB {
	t.Helper()
	dir, err := FlowFabricMigrations()
	if err != nil {
		t.Skipf("skipped: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ffTemplateOnce.Do(func() {
		var fp string
		// FlowFabric's DDL and ours applied after it (the objects).
		if fp, ffTemplateErr = dirFingerprint(dir); ffTemplateErr == nil {
			fp += "_" + migrations.Fingerprint()
			ffTemplateName, ffTemplateErr = ensureTemplate(ctx, "ffr_fftmpl_", fp, func(ctx context.Context, dbURL string) error {
				pool, err := pgxpool.New(ctx, dbURL)
				if err != nil {
					return err
				}
				defer pool.Close()
				if err := ApplyFlowFabric(ctx, pool, dir); err != nil {
					return err
				}
				if _, err := migrations.ApplyRiver(ctx, pool, RiverSchema, nil); err != nil {
					return err
				}
				if err := migrations.ApplyWorkerTable(ctx, pool, RiverSchema); err != nil {
					return err
				}
				_, err = migrations.ApplyObjects(ctx, pool, RiverSchema)
				return err
			})
		}
	})
	if ffTemplateErr != nil {
		t.Fatalf("testdb: build FlowFabric template database: %v", ffTemplateErr)
	}
	return create(t, ctx, ffTemplateName)
}

// FlowFabricMigrations returns the directory of FlowFabric's own Postgres
// migrations: $FF_MIGRATIONS_DIR, else shared/flowfabric/migrations beside
// this clone (../shared from the module root), as CI has it. The error says
// why there is none (a lone clone).
func FlowFabricMigrations() (string, error) {
	if d := os.Getenv("FF_MIGRATIONS_DIR"); d != "" {
		return d, nil
	}
	root, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			return "", errors.New("no go.mod above the test's directory")
		}
		root = parent
	}
	dir := filepath.Join(filepath.Dir(root), "shared", "flowfabric", "migrations")
	if files, _ := filepath.Glob(filepath.Join(dir, "*.sql")); len(files) == 0 {
		return "", fmt.Errorf("FlowFabric's migrations are not at %s (a clone without ../shared beside it; set FF_MIGRATIONS_DIR to run this test)", dir)
	}
	return dir, nil
}

// ApplyFlowFabric applies every *.sql file of dir to pool, in name order,
// each as one multi-statement string, as FlowFabric's migrator applies them.
func ApplyFlowFabric(ctx context.Context, pool *pgxpool.Pool, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, string(sql), pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("FlowFabric migration %s: %w", filepath.Base(f), err)
		}
	}
	return nil
}

func dirFingerprint(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write([]byte(filepath.Base(f)))
		h.Write(b)
	}
	h.Write([]byte(migrations.Fingerprint())) // River's and the worker table's DDL ride along
	h.Write([]byte(templateRecipe))
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// templateRecipe is what ensureTemplate does besides the migration; it is
// part of every template's name, so a change rebuilds the templates.
const templateRecipe = "catalogs analyzed, filled tables recorded"

// analyzeCatalogs analyzes the catalogs of conn's database (not its
// tables: an analyzed empty table is planned as one known to be empty,
// unlike the same table in a database FlowFabric migrated). The migration
// wrote their rows by the ten thousand while they had no statistics, for
// which autovacuum's threshold is 50 changed rows: autovacuum would analyze
// them in the template (clones made before and after would differ) and in
// every test database whose TRUNCATEs change 50 rows of pg_class, writing
// pg_statistic, which reuse.go then takes for the test's doing.
func analyzeCatalogs(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', 'pg_catalog', relname) FROM pg_class
		WHERE relnamespace = 'pg_catalog'::regnamespace AND relkind = 'r' AND NOT relisshared ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("list catalogs: %w", err)
	}
	catalogs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list catalogs: %w", err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+strings.Join(catalogs, ", ")); err != nil {
		return fmt.Errorf("analyze catalogs: %w", err)
	}
	return nil
}

// finishTemplate, on one connection to the database at dbURL, a template
// just migrated, analyzes its catalogs (analyzeCatalogs) and reads which of
// its tables hold rows (templateComment): nil when they cannot be read (the
// server counts no writes), and each process then reads them from a clone
// of its own.
func finishTemplate(ctx context.Context, dbURL string) (*pristine, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if err := analyzeCatalogs(ctx, conn); err != nil {
		return nil, err
	}
	p, _ := readFilled(ctx, conn)
	return p, nil
}

// templateIdle is how long a template of another DDL version is kept
// unused: two checkouts (a branch and main, two CI jobs) sharing one server
// through TEST_DATABASE_URL each keep their own, where dropping every other
// version at once had each drop the other's template under its running
// tests ("template database ... does not exist").
const templateIdle = 6 * time.Hour

// ensureTemplate builds a template database named prefix+fingerprint once
// per server and DDL version, with migrate, and marks it used (its comment:
// the time, read by the next build of another version). Test binaries of
// several packages run in parallel, so the build is serialised with an
// advisory lock and published by a rename only when complete. Templates of
// the same prefix unused for templateIdle are dropped, and so are the
// clones offered for reuse of templates no longer there.
func ensureTemplate(ctx context.Context, prefix, fingerprint string, migrate func(ctx context.Context, dbURL string) error) (string, error) {
	name := prefix + fingerprint
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", redactedAdmin(), err)
	}
	defer admin.Close(ctx)
	// A lock per prefix: the two flavours' templates build side by side
	// (each is one connection's DDL, one core's work for ~20 s).
	lock := "ffreconcile.testdb.template." + prefix
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, lock); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext($1))`, lock) //nolint:errcheck

	// markUsed marks the template used now, keeping the record of its
	// filled tables (parseFilled), and makes it this process's.
	markUsed := func(p *pristine) (string, error) {
		filled := "unknown"
		if p != nil {
			filled = formatFilled(p)
			// This process's server, as it is now, counts writes.
			if trackingCounts(ctx, admin) == nil {
				knowPristine(name, p)
			}
		}
		comment := fmt.Sprintf(templateComment, time.Now().Unix(), filled)
		if _, err := admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS "+quoteLiteral(comment)); err != nil {
			return "", fmt.Errorf("mark template %s used: %w", name, err)
		}
		return name, nil
	}
	var comment string
	err = admin.QueryRow(ctx, `SELECT COALESCE(shobj_description(oid, 'pg_database'), '') FROM pg_database WHERE datname = $1`, name).Scan(&comment)
	if err == nil {
		return markUsed(parseFilled(comment))
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	if err := dropStaleTemplates(ctx, admin, prefix, name, time.Now().Add(-templateIdle)); err != nil {
		return "", err
	}

	building := name + "_building"
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	buildURL, err := WithDatabase(AdminURL(), building)
	if err != nil {
		return "", err
	}
	if err := migrate(ctx, buildURL); err != nil {
		return "", err
	}
	p, err := finishTemplate(ctx, buildURL)
	if err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s",
		pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	return markUsed(p)
}

// dropStaleTemplates drops, before template name is built, the templates of
// prefix last used before usedBefore (or never marked: half-built ones,
// whose build this caller's lock shows dead), and the clones offered for
// reuse (freeFamily) of every template not kept. Left, every schema change
// would leave ~200 MB databases behind, on a cluster that may live in RAM
// (scripts/test-postgres.sh). Offered clones are connected to by no one; one
// in use is not offered.
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, prefix, name string, usedBefore time.Time) error {
	rows, err := admin.Query(ctx, `SELECT datname, COALESCE(shobj_description(oid, 'pg_database'), '') FROM pg_database
		WHERE starts_with(datname, $1) OR starts_with(datname, $2)`, prefix, freeFamily(prefix))
	if err != nil {
		return err
	}
	type db struct{ name, comment string }
	dbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (db, error) {
		var d db
		return d, r.Scan(&d.name, &d.comment)
	})
	if err != nil {
		return err
	}
	kept := []string{name}
	var stale []string
	for _, d := range dbs {
		if !strings.HasPrefix(d.name, prefix) {
			continue
		}
		var used int64
		if _, err := fmt.Sscanf(d.comment, "ffreconcile test template, last used %d", &used); err == nil && used >= usedBefore.Unix() {
			kept = append(kept, d.name)
		} else {
			stale = append(stale, d.name)
		}
	}
	for _, d := range dbs {
		if strings.HasPrefix(d.name, prefix) {
			continue
		}
		if !slices.ContainsFunc(kept, func(k string) bool { return strings.HasPrefix(d.name, freePrefix(k)) }) {
			stale = append(stale, d.name)
		}
	}
	for _, s := range stale {
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop stale test database %s: %w", s, err)
		}
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal (COMMENT takes no
// parameter).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func migrateInto(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.ApplyRiver(ctx, pool, RiverSchema, nil); err != nil {
		return err
	}
	if _, err := migrations.ApplyFF(ctx, pool); err != nil {
		return err
	}
	if err := migrations.ApplyWorkerTable(ctx, pool, RiverSchema); err != nil {
		return err
	}
	_, err = migrations.ApplyObjects(ctx, pool, RiverSchema)
	return err
}

// PoolAsNewRole creates a login role with no rights beyond PUBLIC's, except
// CREATE on d's schema public (PostgreSQL 15 gives PUBLIC none there), and
// returns a pool on d as that role. Pool, what the role owns in d and the
// role itself go when t ends.
func (d *DB) PoolAsNewRole(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	name := "ffr_t_role_" + randomSuffix()
	role := pgx.Identifier{name}.Sanitize()
	if _, err := d.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatalf("testdb: create role: %v", err)
	}
	if _, err := d.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO `+role); err != nil {
		t.Fatalf("testdb: grant create on schema public: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: open pool as %s: %v", role, err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx := context.Background()
		if _, err := d.Pool.Exec(ctx, `DROP OWNED BY `+role); err != nil {
			t.Errorf("testdb: drop what %s owns: %v", role, err)
		}
		if _, err := d.Pool.Exec(ctx, `DROP ROLE `+role); err != nil {
			t.Errorf("testdb: drop role %s: %v", role, err)
		}
	})
	return pool
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redactedAdmin() string {
	u, err := url.Parse(AdminURL())
	if err != nil || u.User == nil {
		return "the test database server"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// InsertRawJob inserts a job into River's river_job with plain SQL, as a
// non-Go River client or a hand-written query would (no insert hooks, no
// unique key), due a second ago, and returns its id. A finalized state gets
// finalized_at, which River's check constraint requires.
func (d *DB) InsertRawJob(t testing.TB, kind, queue, state, args string) int64 {
	t.Helper()
	var id int64
	err := d.Pool.QueryRow(context.Background(), `
		INSERT INTO `+pgx.Identifier{RiverSchema, "river_job"}.Sanitize()+`
		       (args, kind, max_attempts, queue, state, scheduled_at, finalized_at)
		VALUES ($1::jsonb, $2, 5, $3, $4::text::`+pgx.Identifier{RiverSchema, "river_job_state"}.Sanitize()+`,
		        now() - interval '1 second', CASE WHEN $4 IN ('completed', 'cancelled', 'discarded') THEN now() END)
		RETURNING id`, args, kind, queue, state).Scan(&id)
	if err != nil {
		t.Fatalf("insert %s job (%s, %s, %s): %v", kind, queue, state, args, err)
	}
	return id
}

// EachSchema runs test once per way of building the ff_* tables
// (Schemas), each as a parallel subtest named for it on a database of its
// own: the shape of every end-to-end test that shows the worker running
// unchanged on a database FlowFabric migrated.
func EachSchema(t *testing.T, test func(t *testing.T, db *DB)) {
	t.Helper()
	for _, schema := range Schemas {
		t.Run(schema.Name, func(t *testing.T) {
			t.Parallel()
			test(t, schema.New(t))
		})
	}
}
