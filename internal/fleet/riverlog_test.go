package fleet

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestRiverLoggerDemotesProducerCounts: River's "Producer job counts"
// line is logged at debug, so an info-level log no longer holds it, while
// River's other lines and their attributes pass unchanged. A regression
// floods `make run`'s log again, or hides River's warnings.
func TestRiverLoggerDemotesProducerCounts(t *testing.T) {
	for _, tt := range []struct {
		level    slog.Level
		wantLine bool
	}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
		var buf bytes.Buffer
		l := riverLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level}))).With("client", "c1")
		l.Info("producer: Producer job counts", "queue", "ff_rows")
		l.Warn("elector: something went wrong", "error", "boom")
		out := buf.String()
		if got := strings.Contains(out, "Producer job counts"); got != tt.wantLine {
			t.Errorf("level %s: producer counts logged = %v; want %v:\n%s", tt.level, got, tt.wantLine, out)
		}
		if tt.wantLine && !strings.Contains(out, "level=DEBUG msg=\"producer: Producer job counts\" client=c1 queue=ff_rows") {
			t.Errorf("level %s: producer counts not demoted to debug with their attributes:\n%s", tt.level, out)
		}
		if !strings.Contains(out, "level=WARN msg=\"elector: something went wrong\" client=c1 error=boom") {
			t.Errorf("level %s: River's warning changed or lost:\n%s", tt.level, out)
		}
	}
}
