package service

import (
	"errors"
	"strings"
)

// errPath is the error of a request target NormalizePath cannot read.
var errPath = errors.New("server: the original request's path is not a valid URI path")

// NormalizePath returns the normalized path of a request target as a
// proxy passes it to the auth endpoint (nginx's $request_uri, Traefik's
// X-Forwarded-Uri): the form rules see in the "path" entry, and the form
// its counter is keyed by, so that one resource spelt differently is still
// one counter. In order:
//
//  1. The query ("?…") and fragment ("#…") are cut off.
//  2. An absolute target ("http://host/p", "https://…", as a client may
//     send it) is cut to its path; any other target not starting with
//     "/" is refused.
//  3. Percent-encodings are decoded where they stand for an unreserved
//     character (letters, digits, "-", ".", "_", "~"; RFC 3986 §2.3) and
//     for "/" (%2F: most applications decode it before routing, so
//     "/a%2Fb" is "/a/b"); every other one is kept, in upper case ("%3f"
//     becomes "%3F"). A "%" not followed by two hex digits is refused.
//  4. Repeated slashes are collapsed into one.
//  5. Dot segments are removed (RFC 3986 §5.2.4): "/a/./b" is "/a/b",
//     "/a/x/../b" is "/a/b", and ".." never climbs above "/".
//
// Letter case, a trailing slash, ";" parameters, a backslash and "+" are
// kept as they are: the application behind the proxy decides what those
// mean. A refused target is an error; the auth endpoint answers it 400.
func NormalizePath(target string) (string, error) {
	if i := strings.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	if !strings.HasPrefix(target, "/") {
		rest, ok := cutScheme(target)
		if !ok {
			return "", errPath
		}
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return "/", nil
		}
		target = rest[i:]
	}
	decoded, err := decodeUnreserved(target)
	if err != nil {
		return "", err
	}
	return removeDotSegments(decoded), nil
}

// cutScheme returns what follows "http://" or "https://" (in any case) in
// target.
func cutScheme(target string) (string, bool) {
	for _, scheme := range []string{"http://", "https://"} {
		if len(target) >= len(scheme) && strings.EqualFold(target[:len(scheme)], scheme) {
			return target[len(scheme):], true
		}
	}
	return "", false
}

// decodeUnreserved decodes the percent-encodings of unreserved characters
// and of "/", and upper-cases the others.
func decodeUnreserved(p string) (string, error) {
	if !strings.Contains(p, "%") {
		return p, nil
	}
	b := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			return "", errPath
		}
		v := unhex(p[i+1])<<4 | unhex(p[i+2])
		if v == '/' || isUnreserved(v) {
			b = append(b, v)
		} else {
			b = append(b, '%', upperHex(p[i+1]), upperHex(p[i+2]))
		}
		i += 2
	}
	return string(b), nil
}

// removeDotSegments collapses repeated slashes and removes "." and ".."
// segments of p, which starts with "/". A path that ended in "/", "/." or
// "/.." ends in "/".
func removeDotSegments(p string) string {
	if !strings.Contains(p, "//") && !strings.Contains(p, "/.") {
		return p // the common case: nothing to do
	}
	segs := make([]string, 0, strings.Count(p, "/"))
	trailing := false
	for _, seg := range strings.Split(p[1:], "/") {
		trailing = false
		switch seg {
		case "":
			trailing = true
		case ".":
			trailing = true
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			trailing = true
		default:
			segs = append(segs, seg)
		}
	}
	out := "/" + strings.Join(segs, "/")
	if trailing && len(segs) > 0 {
		out += "/"
	}
	return out
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}
