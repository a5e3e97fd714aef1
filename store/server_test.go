package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestReadServerSettings: the settings read are the server's, as SHOW
// gives them (autovacuum as a boolean, whatever spelling the configuration
// used). A regression makes a fleet warn about a healthy server, or stay
// silent on one whose tables will bloat.
func TestReadServerSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	got, err := store.ReadServerSettings(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	show := func(name string) string {
		var v string
		if err := db.Pool.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got.Autovacuum != (show("autovacuum") == "on") {
		t.Errorf("Autovacuum = %v; SHOW autovacuum says %s", got.Autovacuum, show("autovacuum"))
	}
	if v := show("max_locks_per_transaction"); strconv.Itoa(got.MaxLocksPerTransaction) != v {
		t.Errorf("MaxLocksPerTransaction = %d; SHOW says %s", got.MaxLocksPerTransaction, v)
	}
	if v := show("max_connections"); strconv.Itoa(got.MaxConnections) != v {
		t.Errorf("MaxConnections = %d; SHOW says %s", got.MaxConnections, v)
	}
	if got.Version != show("server_version") {
		t.Errorf("Version = %q; SHOW says %s", got.Version, show("server_version"))
	}
}
