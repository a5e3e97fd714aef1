package dbconn_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestOpenMissingDatabaseSaysHowToCreateIt: a URL naming a database the
// server does not have fails with the database named and the command that
// creates it; a regression leaves a newcomer with the server's bare
// "database does not exist".
func TestOpenMissingDatabaseSaysHowToCreateIt(t *testing.T) {
	t.Parallel()
	u, err := testdb.WithDatabase(testdb.AdminURL(), "ffr_no_such_database")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := dbconn.Open(context.Background(), u, dbconn.Options{MaxConns: 1})
	if err == nil {
		pool.Close()
		t.Fatal("Open of a missing database succeeded")
	}
	for _, want := range []string{"cannot reach database", "ffr_no_such_database", "worker migrate --create-database --ff-schema"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open: %v; want it to contain %q", err, want)
		}
	}
}

// TestOpenWithoutAServerSaysWhereOneComesFrom: a URL no server answers at
// fails naming the address and saying how to get a server (`make run`, or
// --database-url), as CreateIfMissing does; a server that answers with an
// error of its own (here, an unknown role) gets no such hint. A regression
// leaves a newcomer with a bare "connection refused".
func TestOpenWithoutAServerSaysWhereOneComesFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A port nothing listens on: one just released by a listener of ours.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	u := "postgres://postgres@" + addr + "/ffreconcile?sslmode=disable&connect_timeout=5"
	_, err = dbconn.Open(ctx, u, dbconn.Options{MaxConns: 1})
	_, err2 := dbconn.CreateIfMissing(ctx, u)
	for _, e := range []error{err, err2} {
		if e == nil {
			t.Fatal("connecting to a port nothing listens on succeeded")
		}
		for _, want := range []string{"cannot reach database", addr, "make run", "--database-url"} {
			if !strings.Contains(e.Error(), want) {
				t.Errorf("error %q; want it to contain %q", e, want)
			}
		}
	}

	role, err := testdb.WithDatabase(testdb.AdminURL(), "postgres")
	if err != nil {
		t.Fatal(err)
	}
	role = strings.Replace(role, "://postgres@", "://ffr_no_such_role@", 1)
	if !strings.Contains(role, "ffr_no_such_role") {
		t.Skipf("admin URL %s names no postgres user to swap", dbconn.Redact(role))
	}
	_, err = dbconn.Open(ctx, role, dbconn.Options{MaxConns: 1})
	if err == nil || strings.Contains(err.Error(), "make run") {
		t.Errorf("Open as an unknown role: %v; want the server's error without the no-server hint", err)
	}
}

// TestCancelOnServerKeepsTheConnection: with CancelOnServer, a statement
// whose context ends is cancelled by the server and the next statement runs
// on the same backend (what it cached survives); without it, pgx closes the
// connection. A regression shows a new backend after the timeout, and a
// tick on a busy server replanning over 256 cold partitions every retry.
func TestCancelOnServerKeepsTheConnection(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmpty(t)
	for _, tc := range []struct {
		name           string
		cancelOnServer bool
	}{
		{"CancelOnServer", true},
		{"PgxDefault", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool, err := dbconn.Open(ctx, db.URL, dbconn.Options{MaxConns: 1, CancelOnServer: tc.cancelOnServer})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			pid := func() (pid int) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				return pid
			}
			before := pid()
			timeoutCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = pool.Exec(timeoutCtx, `SELECT pg_sleep(30)`)
			cancel()
			if err == nil {
				t.Fatal("a 30 s sleep finished within 100 ms")
			}
			if after := pid(); (after == before) != tc.cancelOnServer {
				t.Errorf("backend %d before the timeout, %d after; want the same one: %v", before, after, tc.cancelOnServer)
			}
		})
	}
}
