package jobs_test

import (
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestMain reuses test databases across this package's tests (see
// testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }
