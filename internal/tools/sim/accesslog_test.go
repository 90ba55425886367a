package sim

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var timeAndClient = [2][]string{{"request", "client_ip"}, {"ts"}}

func TestJSONFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line         string
		client, time string // "" when not found
		err          bool
	}{
		{`{"ts":1.5,"request":{"client_ip":"10.0.0.1"}}`, "10.0.0.1", "1.5", false},
		{` { "request" : { "uri" : "/a\"b", "client_ip" : "x" } , "ts" : "2026-01-01T00:00:00Z" } `, "x", "2026-01-01T00:00:00Z", false},
		{`{"request":{"headers":{"A":["b",{"c":[1,2,{}]}]},"client_ip":42},"ts":-0.5e+3,"z":[true,false,null]}`, "42", "-0.5e+3", false},
		{`{"request":{"client_ip":"a"},"request":{"uri":"/"},"ts":1}`, "", "1", false}, // the last "request" wins
		{`{"req\u0075est":{"client_ip":"\u00e9t\u00e9"},"ts":1}`, "été", "1", false},
		{`{"ts":1,"client_ip":"a"}`, "", "1", false},
		{`{}`, "", "", false},
		{`{"ts":1,}`, "", "", true},
		{`{"ts":01}`, "", "", true},
		{`{"ts":1} x`, "", "", true},
		{`{"ts":"a` + "\x01" + `"}`, "", "", true},
		{`{"ts":"\x"}`, "", "", true},
		{`[{"ts":1}]`, "", "", true},
		{`{"ts":1`, "", "", true},
		{`{"ts":tru}`, "", "", true},
		{strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), "", "", true},
	}
	for _, tc := range tests {
		v, err := jsonFields([]byte(tc.line), &timeAndClient)
		if (err != nil) != tc.err {
			t.Errorf("%s: err %v, want an error: %v", tc.line, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		for i, want := range []string{tc.client, tc.time} {
			got := ""
			if v[i].found {
				b, err := v[i].text()
				if err != nil {
					t.Errorf("%s: %v", tc.line, err)
				}
				got = string(b)
			}
			if got != want {
				t.Errorf("%s: field %d = %q, want %q", tc.line, i, got, want)
			}
		}
	}
}

// FuzzJSONFields compares the scanner with encoding/json: a line both
// accept gives the same values (a string's text, a number as written),
// and no line makes it panic.
func FuzzJSONFields(f *testing.F) {
	for _, s := range []string{`{"ts":1.5,"request":{"client_ip":"10.0.0.1"}}`, `{"request":{"client_ip":"\ud83d\ude00"},"ts":"x"}`,
		`{"a":[1,{"b":null}],"ts":-0}`, `{"request":1,"request":{"client_ip":2}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		v, err := jsonFields(line, &timeAndClient)
		if err != nil || !utf8.Valid(line) {
			return // only lines the scanner accepts, in UTF-8 (encoding/json replaces bad bytes), are compared
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var m map[string]any
		if dec.Decode(&m) != nil || dec.More() {
			t.Fatalf("the scanner accepted %q, encoding/json does not", line)
		}
		for i, path := range timeAndClient {
			var at any = m
			for _, k := range path {
				obj, ok := at.(map[string]any)
				if !ok {
					at = nil
					break
				}
				at = obj[k]
			}
			want, found := "", false
			switch x := at.(type) {
			case string:
				want, found = x, true
			case json.Number:
				want, found = string(x), true
			}
			if v[i].found && v[i].kind == "" {
				got, err := v[i].text()
				if err != nil || !found || string(got) != want {
					t.Fatalf("%q: field %v = %q (%v), encoding/json: %q", line, path, got, err, want)
				}
			} else if found {
				t.Fatalf("%q: field %v not found, encoding/json: %q", line, path, want)
			}
		}
	})
}

// FuzzLogLine: no line of any format makes a parser panic, and every
// request has a client of 1 to MaxClientBytes bytes.
func FuzzLogLine(f *testing.F) {
	f.Add([]byte(`10.0.0.1 - - [01/Mar/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "x"`))
	f.Add([]byte(`{"client":"a","time":1772366400.5}`))
	f.Add([]byte(`"a""b",1772366400`))
	formats := []logFormat{
		{name: "nginx"}, {name: "nginx", user: true},
		{name: "json", paths: [2][]string{{"client"}, {"time"}}},
		{name: "csv", cols: [2]int{0, 1}}, {name: "csv", cols: [2]int{3, 0}},
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		for _, lf := range formats {
			p := lineParser{f: lf}
			client, _, err := p.parse(line)
			if err == nil && (len(client) == 0 || len(client) > MaxClientBytes) {
				t.Fatalf("%s: client of %d bytes from %q", lf.name, len(client), line)
			}
		}
	})
}

func TestCSVField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line   string
		fields []string
		err    bool
	}{
		{"a,b,c", []string{"a", "b", "c"}, false},
		{`"a,b", "c""d" ,e,`, []string{"a,b", `c"d`, "e", ""}, false},
		{`""`, []string{""}, false},
		{`"a`, nil, true},
		{`"a"b,c`, nil, true},
	}
	for _, tc := range tests {
		var got []string
		var err error
		for line := []byte(tc.line); line != nil; {
			var field []byte
			if field, line, err = csvField(line); err != nil {
				break
			}
			got = append(got, string(field))
		}
		if (err != nil) != tc.err || (!tc.err && strings.Join(got, "|") != strings.Join(tc.fields, "|")) {
			t.Errorf("%s: %q, %v; want %q (error: %v)", tc.line, got, err, tc.fields, tc.err)
		}
	}
}

func TestSecondsUS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in string
		us int64
		ok bool
	}{
		{"1764478535.123456", 1764478535123456, true},
		{"1764478535.1234567", 1764478535123456, true},
		{"1.5", 1500000, true},
		{"0", 0, true},
		{"12", 12000000, true},
		{"1.", 0, false},
		{".5", 0, false},
		{"1.2.3", 0, false},
		{"1e9", 0, false},
		{"99999999999999999999", 0, false},
	}
	for _, tc := range tests {
		if us, ok := secondsUS(tc.in); us != tc.us || ok != tc.ok {
			t.Errorf("secondsUS(%q) = %d, %v; want %d, %v", tc.in, us, ok, tc.us, tc.ok)
		}
		if us, ok := secondsUS([]byte(tc.in)); us != tc.us || ok != tc.ok {
			t.Errorf("secondsUS([]byte(%q)) = %d, %v", tc.in, us, ok)
		}
	}
}
