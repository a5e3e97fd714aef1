package testdb

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// TraceEnv names a file to which every test database's story is appended,
// one line per event (cloned, claimed, offered, dropped and why), from
// every test binary of a run: how many clones a run costs and which tests
// leave databases that cannot be reused. Unset: nothing is written.
const TraceEnv = "FF_TESTDB_TRACE"

// trace appends an event of the test test about database name to the file
// TraceEnv names. One write per line with O_APPEND: lines of concurrent
// test binaries do not interleave.
func trace(test, event, name, detail string) {
	path := os.Getenv(TraceEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	detail = strings.ReplaceAll(detail, "\n", " ")
	fmt.Fprintf(f, "%s\t%d\t%s\t%s\t%s\t%s\n", time.Now().Format("15:04:05.000"), os.Getpid(), event, test, name, detail)
}
