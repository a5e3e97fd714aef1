package metrics_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// promtool returns the path of promtool, installing it as `make test` does
// (scripts/ensure-promtool.sh: Debian's prometheus package) when it is
// missing. A machine where it cannot be installed fails the test with the
// script's advice rather than skipping it: rules nobody checked would load
// into an operator's Prometheus untested.
func promtool(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../../scripts/ensure-promtool.sh").Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("promtool is needed to check docs/prometheus/alerts.yml and could not be installed:\n%s", msg)
	}
	return strings.TrimSpace(string(out))
}

// TestAlertRules runs Prometheus's own rule checker over the alert rules an
// operator loads (docs/prometheus/alerts.yml): `promtool check rules` (the
// syntax, each expression parsed, the templates) and `promtool test rules`
// on alerts_test.yml, which feeds each alert series that must fire it and
// series that must not, and compares the rendered annotations. A
// regression, a threshold or window changed, a label lost from an
// aggregation, a template broken, fails here instead of on an operator's
// night. That the rules name only exported series is checked against a
// working fleet's /metrics by TestMetricsFollowTheWork.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	tests := []struct {
		name string
		args []string
	}{
		{"Check", []string{"check", "rules", "alerts.yml"}},
		{"Test", []string{"test", "rules", "alerts_test.yml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, tt.args...)
			cmd.Dir = "../../docs/prometheus"
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("promtool %s: %v\n%s", strings.Join(tt.args, " "), err, out)
			}
			if !strings.Contains(string(out), "SUCCESS") {
				t.Fatalf("promtool %s said no SUCCESS:\n%s", strings.Join(tt.args, " "), out)
			}
		})
	}
	t.Run("EveryAlertTested", func(t *testing.T) {
		rules, err := os.ReadFile("../../docs/prometheus/alerts.yml")
		if err != nil {
			t.Fatal(err)
		}
		tests, err := os.ReadFile("../../docs/prometheus/alerts_test.yml")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(rules), "\n") {
			name, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert: ")
			if !ok {
				continue
			}
			n++
			// Firing: an expected alert's annotations carry its runbook.
			if !strings.Contains(string(tests), "alertname: "+name+"\n        exp_alerts:\n          - exp_labels") {
				t.Errorf("alert %s has no promtool test in which it fires", name)
			}
			if !strings.Contains(string(tests), "alertname: "+name+"\n        exp_alerts: []") {
				t.Errorf("alert %s has no promtool test in which it stays quiet", name)
			}
		}
		if n < 6 {
			t.Errorf("found %d alerts in alerts.yml; the check read too little", n)
		}
	})
}
