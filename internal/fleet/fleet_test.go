package fleet

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/workers"
)

func TestRowStatementsDefault(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name              string
		synchronousCommit string
		rowStatements     int
		want              int
	}{
		{name: "commit waits for the flush", want: workers.DefaultRowStatements},
		{name: "explicit on", synchronousCommit: "on", want: workers.DefaultRowStatements},
		{name: "local still waits", synchronousCommit: "local", want: workers.DefaultRowStatements},
		{name: "off", synchronousCommit: "off", want: 1},
		{name: "explicit setting wins under off", synchronousCommit: "off", rowStatements: 3, want: 3},
		{name: "explicit setting wins under on", synchronousCommit: "on", rowStatements: 1, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{SynchronousCommit: tt.synchronousCommit, RowStatements: tt.rowStatements}.WithDefaults()
			if cfg.RowStatements != tt.want {
				t.Errorf("RowStatements = %d, want %d", cfg.RowStatements, tt.want)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestPoolSessionSettings: each pool's sessions carry the settings its
// statements were measured with (see New): custom plans that keep to their
// indexes on the work pool, cached generic plans on the tick pool, custom
// plans for River.
func TestPoolSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	f, err := New(ctx, Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema, SynchronousCommit: "off"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tests := []struct {
		pool    string
		setting string
		want    string
	}{
		{"work", "enable_seqscan", "off"},
		{"work", "plan_cache_mode", "force_custom_plan"},
		{"work", "synchronous_commit", "off"},
		{"tick", "plan_cache_mode", "force_generic_plan"},
		{"tick", "enable_seqscan", "on"},
		{"river", "plan_cache_mode", "force_custom_plan"},
		{"river", "enable_seqscan", "on"},
		{"work", "jit", "off"},
		{"tick", "jit", "off"},
		{"river", "jit", "off"},
	}
	pools := map[string]*pgxpool.Pool{"work": f.WorkPool, "tick": f.TickPool, "river": f.RiverPool}
	for _, tt := range tests {
		t.Run(tt.pool+"/"+tt.setting, func(t *testing.T) {
			var got string
			if err := pools[tt.pool].QueryRow(ctx, "SELECT current_setting($1)", tt.setting).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("%s = %q on the %s pool, want %q", tt.setting, got, tt.pool, tt.want)
			}
		})
	}
}
