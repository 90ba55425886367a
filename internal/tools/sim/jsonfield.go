package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// JSON lines are read by a scanner that walks each line once and keeps
// only the two fields asked for, without decoding the rest: a log of
// millions of lines with dozens of fields each (Caddy's, with every
// request header) is read without an allocation per line. It checks the
// whole line is one JSON object (a line cut short is a bad line), as
// encoding/json would, and where both accept a line they find the same
// values (FuzzJSONFields).

// maxJSONDepth bounds how deep a line's arrays and objects may nest.
const maxJSONDepth = 64

// jsonValue is a field found in a line.
type jsonValue struct {
	found bool
	str   bool   // a string: raw is its content, between the quotes
	esc   bool   // a string holding backslash escapes
	raw   []byte // a number's text, or a string's content
	kind  string // what the value is when not a string or a number
}

// text returns v's text: a number as written, a string unescaped.
func (v jsonValue) text() ([]byte, error) {
	if !v.esc {
		return v.raw, nil
	}
	var s string
	quoted := append(append(make([]byte, 0, len(v.raw)+2), '"'), v.raw...)
	if err := json.Unmarshal(append(quoted, '"'), &s); err != nil {
		return nil, errJSONSyntax
	}
	return []byte(s), nil
}

var (
	errJSONSyntax = errors.New("not a JSON object")
	errJSONDepth  = fmt.Errorf("not a JSON object: nested deeper than %d", maxJSONDepth)
)

// jsonFields returns the values at the two paths (each a list of keys,
// one per nested object) in line, a JSON object; a path found twice keeps
// its last value, as encoding/json does.
func jsonFields(line []byte, paths *[2][]string) ([2]jsonValue, error) {
	s := jscan{b: line, paths: paths}
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return s.out, errJSONSyntax
	}
	if err := s.value(3, 0); err != nil {
		return s.out, err
	}
	s.ws()
	if s.i != len(s.b) {
		return s.out, errJSONSyntax
	}
	return s.out, nil
}

type jscan struct {
	b     []byte
	i     int
	depth int
	paths *[2][]string
	out   [2]jsonValue
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads the value at s.i, looking inside it (an object) for the
// paths in active (a bit for each) that have matched level keys so far.
func (s *jscan) value(active uint8, level int) error {
	if s.i >= len(s.b) {
		return errJSONSyntax
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(active, level)
	case c == '[':
		return s.array()
	case c == '"':
		_, _, err := s.str()
		return err
	case c == 't':
		return s.word("true")
	case c == 'f':
		return s.word("false")
	case c == 'n':
		return s.word("null")
	default:
		return s.number()
	}
}

func (s *jscan) object(active uint8, level int) error {
	if s.depth++; s.depth > maxJSONDepth {
		return errJSONDepth
	}
	s.i++ // '{'
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return errJSONSyntax
		}
		key, esc, err := s.str()
		if err != nil {
			return err
		}
		if esc {
			if key, err = (jsonValue{raw: key, esc: true}).text(); err != nil {
				return err
			}
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errJSONSyntax
		}
		s.i++
		s.ws()
		if err := s.member(key, active, level); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errJSONSyntax
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return errJSONSyntax
		}
	}
}

// member reads the value of key, capturing it for a path that ends there
// and looking inside it for a path that goes on.
func (s *jscan) member(key []byte, active uint8, level int) error {
	var capture, next uint8
	for p := range 2 {
		path := s.paths[p]
		if active&(1<<p) == 0 || level >= len(path) || path[level] != string(key) {
			continue
		}
		s.out[p] = jsonValue{} // a later member of this name replaces the earlier
		if level == len(path)-1 {
			capture |= 1 << p
		} else {
			next |= 1 << p
		}
	}
	start := s.i
	if err := s.value(next, level+1); err != nil {
		return err
	}
	if capture == 0 {
		return nil
	}
	v := jsonValue{found: true, raw: s.b[start:s.i]}
	switch c := s.b[start]; {
	case c == '"':
		v.str, v.raw = true, v.raw[1:len(v.raw)-1]
		v.esc = bytes.IndexByte(v.raw, '\\') >= 0
	case c == '{':
		v.kind = "an object"
	case c == '[':
		v.kind = "a list"
	case c == 't' || c == 'f':
		v.kind = "true or false"
	case c == 'n':
		v.kind = "null"
	}
	for p := range 2 {
		if capture&(1<<p) != 0 {
			s.out[p] = v
		}
	}
	return nil
}

func (s *jscan) array() error {
	if s.depth++; s.depth > maxJSONDepth {
		return errJSONDepth
	}
	s.i++ // '['
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if err := s.value(0, 0); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return errJSONSyntax
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return errJSONSyntax
		}
	}
}

// str reads a string at s.i and returns its content, escapes included,
// and whether it holds any.
func (s *jscan) str() (content []byte, esc bool, err error) {
	start := s.i + 1
	for i := start; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return s.b[start:i], esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(s.b) {
				return nil, false, errJSONSyntax
			}
			switch s.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 >= len(s.b) || !hex4(s.b[i+2:i+6]) {
					return nil, false, errJSONSyntax
				}
				i += 5
			default:
				return nil, false, errJSONSyntax
			}
		case c < 0x20:
			return nil, false, errJSONSyntax
		}
	}
	return nil, false, errJSONSyntax
}

func hex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *jscan) word(w string) error {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return errJSONSyntax
	}
	s.i += len(w)
	return nil
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jscan) number() error {
	i := s.i
	if i < len(s.b) && s.b[i] == '-' {
		i++
	}
	switch {
	case i < len(s.b) && s.b[i] == '0':
		i++
	case i < len(s.b) && '1' <= s.b[i] && s.b[i] <= '9':
		i = digitsFrom(s.b, i)
	default:
		return errJSONSyntax
	}
	if i < len(s.b) && s.b[i] == '.' {
		if j := digitsFrom(s.b, i+1); j > i+1 {
			i = j
		} else {
			return errJSONSyntax
		}
	}
	if i < len(s.b) && (s.b[i] == 'e' || s.b[i] == 'E') {
		i++
		if i < len(s.b) && (s.b[i] == '+' || s.b[i] == '-') {
			i++
		}
		if j := digitsFrom(s.b, i); j > i {
			i = j
		} else {
			return errJSONSyntax
		}
	}
	s.i = i
	return nil
}

// digitsFrom returns the index past the digits of b from i on.
func digitsFrom(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
