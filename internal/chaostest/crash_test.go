package chaostest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/migrations"
)

// cluster is a throwaway PostgreSQL cluster of the test's own, so it can be
// crashed: initdb'd in a temporary directory (as the postgres user when the
// test runs as root, as initdb requires), on a free port. It starts with
// fsync off, for the thousands of tables of the migration; the test turns
// it on (durableFromNow) before anything it checks is written.
type cluster struct {
	bin, dir, port string
	asPostgres     bool
}

// pgBinDir returns the newest PostgreSQL server binaries' directory, or ""
// when there are none.
func pgBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	if len(dirs) > 0 {
		return dirs[len(dirs)-1]
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// startCluster initdb's and starts a cluster, stopped and removed when the
// test ends; it skips the test, saying why, where that cannot be done.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{bin: pgBinDir(), asPostgres: os.Geteuid() == 0}
	if c.bin == "" {
		t.Skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
	}
	if c.asPostgres {
		if _, err := user.Lookup("postgres"); err != nil {
			t.Skip("running as root without a postgres user to run initdb as")
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			t.Skip("running as root without runuser to run initdb as postgres")
		}
	}
	dir, err := os.MkdirTemp("", "ffcrash-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = filepath.Join(dir, "data")
	if c.asPostgres {
		// The postgres user must reach and own the data directory.
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v\n%s", dir, err, out)
		}
	}
	t.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate")
		os.RemoveAll(dir)
	})
	if out, err := c.run(filepath.Join(c.bin, "initdb"), "-D", c.dir, "-U", "postgres", "--auth=trust", "--no-sync"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	conf := `
listen_addresses = '127.0.0.1'
port = ` + c.port + `
unix_socket_directories = ''
fsync = off
max_locks_per_transaction = 256
shared_buffers = 64MB
# Crash recovery starts by syncing the data directory: one syncfs(2) per
# file system instead of an fsync per file (~50,000 of them: two migrated
# databases), which took several seconds of the server's downtime.
recovery_init_sync_method = syncfs
`
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.pgctl("start"); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cluster) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	if c.asPostgres {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return cmd.CombinedOutput()
}

// pgctl runs pg_ctl; start waits until the server accepts connections.
func (c *cluster) pgctl(action string, args ...string) error {
	args = append([]string{action, "-D", c.dir, "-w", "-t", "60"}, args...)
	if action == "start" {
		args = append(args, "-l", filepath.Join(c.dir, "server.log"))
	}
	if out, err := c.run(filepath.Join(c.bin, "pg_ctl"), args...); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pg_ctl %s: %v\n%s\nserver log:\n%s", action, err, out, tail(string(log), 10))
	}
	return nil
}

func (c *cluster) url() string { return c.urlFor("postgres") }

// urlFor is the URL of c's database db.
func (c *cluster) urlFor(db string) string {
	return "postgres://postgres@127.0.0.1:" + c.port + "/" + db + "?sslmode=disable"
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestDatabaseCrash crashes PostgreSQL (pg_ctl stop -m immediate: no
// checkpoint, as a power cut) while leases fall due and workers release
// them, restarts it, and leaves the workers running: each must come back by
// itself (its pools reconnect, River re-elects and rescues the jobs the
// crash interrupted), release every lease whose row survived, and write
// exactly one `expired` event per lease. Two workers live through the same
// crash, each on a database of its own: one under --synchronous-commit on,
// one under off. With off, a commit acknowledged just before the crash can
// be lost with its event; the lease is then expired again and released
// again, so the count is still one. A regression shows as a worker that
// exits or never recovers, a lease left expired, or a second event for a
// lease (an action applied twice) or none.
//
// It runs beside the package's other parallel tests: its cluster is its own.
// The second database is a copy of the first (CREATE DATABASE … TEMPLATE),
// so the 256-partition migration runs once, and the two settings share one
// crash: about 40 s beside the package's other tests (initdb and the
// migration about 20 s; the server down 2 s, every lease released 4 s after
// the restart).
func TestDatabaseCrash(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := context.Background()
	migrateAndCopy(t, c, "crash_on", "crash_off")
	pool, err := dbconn.Open(ctx, c.url(), dbconn.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	durableFromNow(t, pool)
	pool.Close()
	bin := workerBinary(t)

	runs := []*crashRun{{commit: "on", db: "crash_on"}, {commit: "off", db: "crash_off"}}
	for _, r := range runs {
		r.p = newProc(t, bin, c.urlFor(r.db), "crash-"+r.commit, "--reconcilers", "lease_expiry",
			"--synchronous-commit", r.commit, "--rescue-stuck-jobs-after", "21s")
		if err := r.p.startReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.p.stop() })
	}

	// Feed leases expiring half a second after their insert, 20 per
	// 100 ms into each database, for 6 s; crash the server 2 s in, restart
	// it a second later. Inserts fail while it is down; only committed rows
	// count, and the checks below read them from the database, not from the
	// feeders.
	for _, r := range runs {
		r.feed(t, c)
	}
	time.Sleep(2 * time.Second)
	crashedAt := time.Now()
	if err := c.pgctl("stop", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := c.pgctl("start"); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	for _, r := range runs {
		<-r.feedDone
	}
	for _, r := range runs {
		t.Run("SynchronousCommit"+strings.ToUpper(r.commit[:1])+r.commit[1:], func(t *testing.T) {
			r.check(t, c, restartedAt.Sub(crashedAt), restartedAt)
		})
	}
}

// migrateAndCopy creates and migrates the database first of c's, as `worker
// migrate --ff-schema` does, and copies it into each of copies.
func migrateAndCopy(t *testing.T, c *cluster, first string, copies ...string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.url())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+first); err != nil {
		t.Fatal(err)
	}
	pool, err := dbconn.Open(ctx, c.urlFor(first), dbconn.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyRiver(ctx, pool, "river", nil); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ApplyWorkerTable(ctx, pool, "river"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPromoteFunction(ctx, pool, "river"); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyFF(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close() // a template database takes no other connection
	for _, name := range copies {
		// FILE_COPY copies the files instead of logging every block of
		// ~25,000 relations through WAL (PostgreSQL 15's default).
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE `+first+` STRATEGY FILE_COPY`); err != nil {
			t.Fatal(err)
		}
	}
}

// crashRun is one worker and its feed through TestDatabaseCrash's crash.
type crashRun struct {
	commit, db string
	p          *proc
	failed     atomic.Int64
	feedDone   chan struct{}
}

// feed inserts leases into r's database for 6 s, counting the inserts that
// fail (the server is down for one of those seconds).
func (r *crashRun) feed(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	pool, err := dbconn.Open(ctx, c.urlFor(r.db), dbconn.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	r.feedDone = make(chan struct{})
	go func() {
		defer close(r.feedDone)
		defer pool.Close()
		stop := time.Now().Add(6 * time.Second)
		for time.Now().Before(stop) {
			// 20 leased executions whose leases expire in half a second.
			expires := time.Now().UnixMilli() + 500
			execs := make([]ffseed.Exec, 20)
			attempts := make([]ffseed.Attempt, 20)
			for i := range execs {
				execs[i] = ffseed.Exec{Partition: int16(rand.IntN(256)), ID: ffseed.NewUUID(), LaneID: "crash"}
				attempts[i] = ffseed.Attempt{Partition: execs[i].Partition, ExecutionID: execs[i].ID, LeaseEpoch: 1,
					LeaseExpiresAtMs: &expires}
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return errors.Join(ffseed.InsertMany(ctx, tx, execs), ffseed.InsertMany(ctx, tx, attempts))
			})
			if err != nil {
				r.failed.Add(1)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// check waits for every lease of r's database to be released, then checks
// each has exactly one expired event and the worker never exited.
func (r *crashRun) check(t *testing.T, c *cluster, down time.Duration, restartedAt time.Time) {
	ctx := context.Background()
	pool, err := dbconn.Open(ctx, c.urlFor(r.db), dbconn.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var leases, expired int
	fleettest.WaitFor(t, 270*time.Second, "every lease released after the crash", func() (bool, string) {
		if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE lease_expires_at_ms IS NOT NULL) FROM ff_attempt`).Scan(&leases, &expired); err != nil {
			return false, fleettest.Statusf("read: %v", err)
		}
		return leases > 0 && expired == 0, fleettest.Statusf("%d of %d leases still expired; worker log:\n%s", expired, leases, r.p.logTail(5))
	})
	var none, twice int
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE n = 0), count(*) FILTER (WHERE n > 1)
		  FROM (SELECT (SELECT count(*) FROM ff_lease_event ev
		                 WHERE ev.execution_id = a.execution_id::text AND ev.event_type = 'expired') AS n
		          FROM ff_attempt a) AS per`).Scan(&none, &twice); err != nil {
		t.Fatal(err)
	}
	if none != 0 || twice != 0 {
		t.Errorf("%d leases: %d without an expired event, %d with more than one; want exactly one each", leases, none, twice)
	}
	if r.failed.Load() == 0 {
		t.Error("no insert failed while the server was down: the crash did not happen as planned")
	}
	if ex := r.p.unexpectedExits(); len(ex) > 0 {
		t.Errorf("the worker exited on its own: %v", ex)
	}
	t.Logf("synchronous_commit %s: %d leases released with one event each; server down %s, %d feeds failed meanwhile; all released %s after the restart",
		r.commit, leases, down.Round(time.Millisecond), r.failed.Load(), time.Since(restartedAt).Round(time.Millisecond))
}

// durableFromNow turns fsync on (a reload is enough) and checkpoints, so
// that what the test writes from now on is written as on a production
// server, and checks that it took.
func durableFromNow(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{`ALTER SYSTEM SET fsync = on`, `SELECT pg_reload_conf()`, `CHECKPOINT`} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	fleettest.WaitFor(t, fleettest.Patient, "fsync on", func() (bool, string) {
		var v string
		if err := pool.QueryRow(ctx, `SHOW fsync`).Scan(&v); err != nil {
			return false, err.Error()
		}
		return v == "on", "fsync " + v
	})
}
