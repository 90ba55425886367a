package headers

import (
	"testing"

	"github.com/tollgate/tollgate/internal/headerfmt"
)

// TestFlavorBits: the flavours are the bits the writer reads.
func TestFlavorBits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    Flavor
		want headerfmt.Flavor
	}{{Draft, headerfmt.Draft}, {RateLimitFields, headerfmt.RateLimitFields}, {XRateLimit, headerfmt.XRateLimit}} {
		if got := headerfmt.Flavor(tc.f); got != tc.want {
			t.Errorf("%v is bit %d, the writer's is %d", tc.f, got, tc.want)
		}
	}
}
