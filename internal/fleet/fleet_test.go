package fleet

import (
	"testing"

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
			cfg := Config{SynchronousCommit: tt.synchronousCommit, RowStatements: tt.rowStatements}
			cfg.setDefaults()
			if cfg.RowStatements != tt.want {
				t.Errorf("RowStatements = %d, want %d", cfg.RowStatements, tt.want)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}
