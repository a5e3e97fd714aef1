package testlog_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testlog"
)

// TestBufferConcurrentWrites: writes from many goroutines all arrive whole,
// while a reader reads; under -race a regression (an unguarded buffer) is a
// reported race, otherwise lost or torn lines.
func TestBufferConcurrentWrites(t *testing.T) {
	t.Parallel()
	var b testlog.Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "g%d-%d\n", g, i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines; want 800", len(lines))
	}
	for g := range 8 {
		if !strings.Contains(b.String(), fmt.Sprintf("g%d-99\n", g)) {
			t.Errorf("goroutine %d's last line is missing", g)
		}
	}
}
