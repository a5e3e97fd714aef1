package bench

import (
	"strings"
	"testing"
	"time"
)

// TestSoakSectionSplicing: `make soak` replaces the soak section of
// docs/benchmarks.md and keeps the rest; `make bench`, which rewrites the
// report, keeps the soak section. A regression loses half an hour of
// measurements (the soak's or the benchmark's) on the next run of the other.
func TestSoakSectionSplicing(t *testing.T) {
	t.Parallel()
	soak := func(rate int) string {
		res := &SoakResult{Rate: rate, Duration: time.Minute, Window: time.Minute,
			Windows: []SoakWindow{{End: time.Minute, ByReconciler: map[string]SoakLateness{"lease_expiry": {Rows: 3}}}}}
		return res.Markdown("worker bench --soak 1m", "test machine", time.Unix(0, 0))
	}
	first, second := soak(10), soak(20)
	report := "# Benchmarks\n\n## Throughput\n\nnumbers\n"

	tests := []struct {
		name, doc, section string
		want               []string // in this order
		gone               []string
	}{
		{"IntoAReportWithout", report, first, []string{"## Throughput", "at 10 items"}, nil},
		{"IntoAnEmptyFile", "", first, []string{"at 10 items"}, nil},
		{"ReplacesThePrevious", SpliceSoak(report+"\n## Idle cost\n", first), second,
			[]string{"## Throughput", "## Idle cost", "at 20 items"}, []string{"at 10 items"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := SpliceSoak(tt.doc, tt.section)
			at := 0
			for _, w := range tt.want {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("%q missing (in order) from:\n%s", w, got)
				}
				at += i
			}
			for _, g := range tt.gone {
				if strings.Contains(got, g) {
					t.Fatalf("%q still in:\n%s", g, got)
				}
			}
			if strings.Count(got, soakBegin) != 1 || strings.Count(got, soakEnd) != 1 {
				t.Fatalf("want one soak section:\n%s", got)
			}
			if SoakSection(got) != tt.section {
				t.Fatalf("SoakSection:\n%s\nwant:\n%s", SoakSection(got), tt.section)
			}
		})
	}
	if SoakSection(report) != "" {
		t.Fatal("SoakSection of a report without one is not empty")
	}
}
