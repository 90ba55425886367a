// Package tieredprom exports a tiered.Store's counters to Prometheus: how
// many decisions went to the global store, failed there, were denied
// locally, admitted from leases or made in degraded mode, and the circuit
// breaker's transitions and state. It is a separate package so that
// tiered itself does not depend on the Prometheus client.
//
// The figures are read from Store.Stats when Prometheus scrapes, so the
// decision path pays nothing for them.
package tieredprom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/tiered"
)

// Register registers a collector of s's counters with reg. Every metric
// carries the label store="<name>", so several stores can share a
// registry.
func Register(reg prometheus.Registerer, s *tiered.Store, name string) error {
	if err := reg.Register(newCollector(s, name)); err != nil {
		return fmt.Errorf("tieredprom: register %q: %w", name, err)
	}
	return nil
}

type collector struct {
	s     *tiered.Store
	descs struct {
		globalCalls, globalErrors, localDenials, leasesTaken, leaseHits, degraded, transitions, state, remembered *prometheus.Desc
	}
}

func newCollector(s *tiered.Store, name string) *collector {
	c := &collector{s: s}
	labels := prometheus.Labels{"store": name}
	d := func(metric, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc("tollgate_tiered_"+metric, help, variable, labels)
	}
	c.descs.globalCalls = d("global_calls_total", "Calls to the global store (a lease taken is one).")
	c.descs.globalErrors = d("global_errors_total", "Calls to the global store that failed or timed out.")
	c.descs.localDenials = d("local_denials_total", "Denials answered by the local tier without a global call.")
	c.descs.leasesTaken = d("leases_taken_total", "Token leases taken from the global store.")
	c.descs.leaseHits = d("lease_hits_total", "Decisions admitted from a lease without a global call.")
	c.descs.degraded = d("degraded_decisions_total", "Decisions made by the degraded-mode local limit because the global store failed or the breaker was open.")
	c.descs.transitions = d("breaker_transitions_total", "Circuit breaker transitions, by the state entered.", "to")
	c.descs.state = d("breaker_state", "Circuit breaker state: 0 closed, 1 open, 2 half-open.")
	c.descs.remembered = d("remembered_keys", "Keys whose last global answer the denial cache holds.")
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.descs.globalCalls, c.descs.globalErrors, c.descs.localDenials, c.descs.leasesTaken,
		c.descs.leaseHits, c.descs.degraded, c.descs.transitions, c.descs.state, c.descs.remembered} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(c.descs.globalCalls, st.GlobalCalls)
	counter(c.descs.globalErrors, st.GlobalErrors)
	counter(c.descs.localDenials, st.LocalDenials)
	counter(c.descs.leasesTaken, st.LeasesTaken)
	counter(c.descs.leaseHits, st.LeaseHits)
	counter(c.descs.degraded, st.Degraded)
	counter(c.descs.transitions, st.BreakerOpened, tiered.Open.String())
	counter(c.descs.transitions, st.BreakerProbes, tiered.HalfOpen.String())
	counter(c.descs.transitions, st.BreakerClosed, tiered.Closed.String())
	ch <- prometheus.MustNewConstMetric(c.descs.state, prometheus.GaugeValue, float64(st.State))
	ch <- prometheus.MustNewConstMetric(c.descs.remembered, prometheus.GaugeValue, float64(st.Remembered))
}
