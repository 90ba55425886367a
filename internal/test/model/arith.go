package model

import (
	"math/big"
	"math/bits"
)

// Checked int64 arithmetic: the model panics rather than compute a wrong
// answer, so an overflow shows up as a failing test, never as agreement.

func add(a, b int64) int64 {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		panic("model: int64 overflow in add")
	}
	return s
}

func sub(a, b int64) int64 {
	if b == -1<<63 {
		panic("model: int64 overflow in sub")
	}
	return add(a, -b)
}

func mul(a, b int64) int64 {
	if a < 0 || b < 0 {
		panic("model: mul of a negative number")
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		panic("model: int64 overflow in mul")
	}
	return int64(lo)
}

// floorDiv returns ⌊a/b⌋ for b > 0 (a may be negative).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Rationals. Every helper returns a new value.

func ratInt(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

func ratFrac(a, b int64) *big.Rat { return new(big.Rat).SetFrac64(a, b) }

func ratAdd(a, b *big.Rat) *big.Rat { return new(big.Rat).Add(a, b) }

func ratSub(a, b *big.Rat) *big.Rat { return new(big.Rat).Sub(a, b) }

func ratMul(a, b *big.Rat) *big.Rat { return new(big.Rat).Mul(a, b) }

func ratMin(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}

func ratMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

// floorInt returns ⌊x⌋ as a big.Int.
func floorInt(x *big.Rat) *big.Int {
	q, m := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if m.Sign() < 0 {
		q.Sub(q, big.NewInt(1))
	}
	return q
}

// floorRat returns ⌊x⌋, which must fit an int64.
func floorRat(x *big.Rat) int64 { return toInt64(floorInt(x)) }

// ceilRat returns ⌈x⌉, which must fit an int64.
func ceilRat(x *big.Rat) int64 {
	f := floorInt(x)
	if !x.IsInt() {
		f.Add(f, big.NewInt(1))
	}
	return toInt64(f)
}

func toInt64(v *big.Int) int64 {
	if !v.IsInt64() {
		panic("model: value does not fit an int64: " + v.String())
	}
	return v.Int64()
}

// roundDown returns x rounded down to a multiple of 1/unit.
func roundDown(x *big.Rat, unit *big.Int) *big.Rat {
	scaled := new(big.Rat).Mul(x, new(big.Rat).SetInt(unit))
	return new(big.Rat).SetFrac(floorInt(scaled), unit)
}

// roundUp returns x rounded up to a multiple of 1/unit.
func roundUp(x *big.Rat, unit *big.Int) *big.Rat {
	scaled := new(big.Rat).Mul(x, new(big.Rat).SetInt(unit))
	c := floorInt(scaled)
	if !scaled.IsInt() {
		c.Add(c, big.NewInt(1))
	}
	return new(big.Rat).SetFrac(c, unit)
}
