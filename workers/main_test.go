package workers_test

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
)

// parallelEnv, when set (`make test` sets it from TEST_PARALLEL_WORKERS),
// is how many of this package's tests run at once, in place of go test's
// -parallel. Most of them start a fleet and wait for its 1 s ticks (the
// shortest River allows) and for deadlines seconds ahead: alone at 4 at
// once the package kept 0.76 of a core busy for 135 s and was the suite's
// longest package; at 8 it takes about 90 s beside the others.
const parallelEnv = "FF_TEST_PARALLEL_WORKERS"

func TestMain(m *testing.M) {
	flag.Parse()
	if v := os.Getenv(parallelEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a positive number of tests\n", parallelEnv, v)
			os.Exit(2)
		}
		if err := flag.Set("test.parallel", v); err != nil {
			fmt.Fprintf(os.Stderr, "set -test.parallel: %v\n", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}
