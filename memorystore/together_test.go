package memorystore_test

import (
	"math/rand/v2"
	"testing"

	"github.com/tollgate/tollgate/internal/test/conformance"
)

// TestModelAll checks AllowAll against the reference model: random sets
// of up to four limits of any algorithms on one key, with limit changes,
// clock steps back and expired state kept or dropped at random (see
// conformance.ModelAll). -steps sets how many calls each of the four
// seeds makes.
func TestModelAll(t *testing.T) {
	s := seed(t)
	for i := range uint64(4) {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			conformance.ModelAll(t, modelTarget(), rand.NewPCG(s, 0xa11+i), *modelSteps)
		})
	}
}

func FuzzAll(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		conformance.ModelAll(t, modelTarget(), conformance.NewByteSource(data), 300)
	})
}
