package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// HistogramCount is how many observations the histogram name on reg holds
// in the series whose labels include every one of labels; 0 when there is
// no such series.
func HistogramCount(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v == lp.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}
