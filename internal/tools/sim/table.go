package sim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteTable writes rep as a Markdown table, after a line saying what the
// traffic and the limit were. Without Config.Redis, the Redis column says
// "not measured".
func WriteTable(w io.Writer, rep Report) error {
	var b strings.Builder
	tr, l := rep.Traffic, rep.Config.Limit
	fmt.Fprintf(&b, "**%s**: %s, for %s: %d requests. Limit: %s.\n\n",
		tr.Name, tr.Description, short(tr.Span), len(tr.Times), limitText(rep.Config))
	fmt.Fprintf(&b, "| algorithm | admitted | vs exact log | denied | most in any %s | over the limit | denied with room | state in memory | state in Redis |\n", short(l.Period))
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rep.Results {
		redisBytes := "not measured"
		if rep.Config.Redis != nil {
			redisBytes = strconv.Itoa(r.RedisBytes) + " B"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %d | %s | %d B | %s |\n",
			algorithmName(r), r.Admitted, vsLog(r), r.Denied, r.MaxInPeriod, r.Over, underText(r), r.MemoryBytes, redisBytes)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// limitText says what a simulation's limit is: "10 per 1s, burst 10; the
// leaky bucket shapes: burst 1, delays up to 1s".
func limitText(c Config) string {
	l := c.Limit
	s := fmt.Sprintf("%d per %s, burst %d", l.Rate, short(l.Period), l.Burst)
	switch {
	case c.MaxDelay > 0:
		s += fmt.Sprintf("; the leaky bucket shapes: burst %d, delays up to %s", leakyBurst(c), short(c.MaxDelay))
	case leakyBurst(c) != l.Burst:
		s += fmt.Sprintf("; the leaky bucket's burst %d", leakyBurst(c))
	}
	return s
}

func leakyBurst(c Config) int {
	if c.LeakyBurst > 0 {
		return c.LeakyBurst
	}
	return c.Limit.Burst
}

// algorithmName names a result's algorithm, marking a shaping leaky bucket.
func algorithmName(r Result) string {
	if r.Limit.MaxDelay > 0 {
		return r.Limit.Algorithm.String() + " (shaping)"
	}
	return r.Limit.Algorithm.String()
}

// vsLog prints how many more (or fewer) requests were admitted than an
// exact sliding log admitted: "+4.5%".
func vsLog(r Result) string {
	if r.LogAdmitted == 0 || r.Admitted == r.LogAdmitted {
		return "0"
	}
	d := 100 * float64(r.Admitted-r.LogAdmitted) / float64(r.LogAdmitted)
	sign, prec := "+", 1
	if d < 0 {
		sign, d = "−", -d
	}
	if d < 0.1 {
		prec = 2
	}
	return sign + strconv.FormatFloat(d, 'f', prec, 64) + "%"
}

// underText prints Under, or a dash where it does not apply.
func underText(r Result) string {
	if r.Under < 0 {
		return "—"
	}
	return strconv.Itoa(r.Under)
}
