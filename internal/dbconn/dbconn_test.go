package dbconn_test

import (
	"context"
	"strings"
	"testing"

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
	for _, want := range []string{"cannot reach database", "ffr_no_such_database", "worker migrate --create-database"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open: %v; want it to contain %q", err, want)
		}
	}
}
