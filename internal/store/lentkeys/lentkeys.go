// Package lentkeys says which stores may be lent their keys: handed a key
// whose bytes are the caller's, valid only until the call returns, because
// the store copies a key it keeps. A door that knows its store is one
// builds each request's store key in a buffer it reuses, and allocates no
// string for it; with any other store it allocates, as a string passed to
// code that may keep it must be.
//
// A store registers its own concrete type, from its package's init: a
// type that embeds it, or wraps it, is not registered, since it may keep
// the keys it is given.
package lentkeys

import "github.com/tollgate/tollgate"

// lenders are the registered checks; written only by package inits.
var lenders []func(tollgate.Store) bool

// Register records that the stores for which is returns true copy every
// key they keep, and may be lent keys. Call it from an init function.
func Register(is func(tollgate.Store) bool) { lenders = append(lenders, is) }

// Lend reports whether s may be lent its keys.
func Lend(s tollgate.Store) bool {
	for _, is := range lenders {
		if is(s) {
			return true
		}
	}
	return false
}
