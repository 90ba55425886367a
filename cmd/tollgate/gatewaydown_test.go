package main

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// hungServer accepts connections and never answers: a tollgate that
// stopped answering. It returns its base URL.
func hungServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + l.Addr().String()
}

// TestGatewaysTollgateDown runs the shipped nginx and Caddy examples, as
// they are and with their "fail open" lines uncommented, in front of a
// tollgate that cannot be reached, one that never answers, one that
// answers 400 (started for the other gateway's headers) and one that
// works, and checks what a client gets from each.
func TestGatewaysTollgateDown(t *testing.T) {
	t.Parallel()
	app, _ := countingApp(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, edgeRules)
	forNginx := startTollgate(t, "serve", "--config", rules)
	forCaddy := startTollgate(t, "serve", "--config", rules, "--auth-proxy", "caddy")
	down, hung := "http://"+freePort(t), hungServer(t)
	nginxConf, caddyConf := readExample(t, "nginx/nginx.conf"), readExample(t, "caddy/Caddyfile")
	nginx := func(t *testing.T, conf, tollgate string) string {
		return startNginxText(t, conf, "127.0.0.1:8088",
			[2]string{"server 127.0.0.1:8080;", "server " + strings.TrimPrefix(tollgate, "http://") + ";"},
			[2]string{"server 127.0.0.1:9000;", "server " + strings.TrimPrefix(app.URL, "http://") + ";"})
	}
	caddy := func(t *testing.T, conf, tollgate string) string { return startCaddy(t, conf, tollgate, app.URL) }

	tests := []struct {
		name     string
		gateway  func(t *testing.T, conf, tollgate string) string
		conf     string
		tollgate string
		want     []int // the answers to requests from one address
	}{
		{"nginx, unreachable", nginx, nginxConf, down, []int{500}},
		{"nginx, no answer", nginx, nginxConf, hung, []int{500}},
		{"nginx, 400", nginx, nginxConf, forCaddy.http, []int{500}},
		{"nginx fail open, unreachable", nginx, failOpen(t, nginxConf), down, []int{200, 200, 200, 200}},
		{"nginx fail open, no answer", nginx, failOpen(t, nginxConf), hung, []int{200}},
		{"nginx fail open, 400", nginx, failOpen(t, nginxConf), forCaddy.http, []int{500}},
		{"nginx fail open, working", nginx, failOpen(t, nginxConf), forNginx.http, []int{200, 200, 200, 429}},
		{"caddy, unreachable", caddy, caddyConf, down, []int{502}},
		{"caddy, no answer", caddy, caddyConf, hung, []int{504}},
		{"caddy, 400", caddy, caddyConf, forNginx.http, []int{400}},
		{"caddy fail open, unreachable", caddy, failOpen(t, caddyConf), down, []int{200, 200, 200, 200}},
		{"caddy fail open, no answer", caddy, failOpen(t, caddyConf), hung, []int{200}},
		{"caddy fail open, 400", caddy, failOpen(t, caddyConf), forNginx.http, []int{400}},
		{"caddy fail open, working", caddy, failOpen(t, caddyConf), forCaddy.http, []int{200, 200, 200, 429}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.gateway(t, tc.conf, tc.tollgate)
			c := client("127.0.1." + strconv.Itoa(i+1))
			for j, want := range tc.want {
				got := send(t, c, base+"/hello")
				if got.code != want {
					t.Fatalf("request %d: %d %q, want %d", j+1, got.code, got.body, want)
				}
				if fromApp := got.header.Get("X-App") == "yes"; fromApp != (want == 200) {
					t.Errorf("request %d: %d from the app: %v", j+1, want, fromApp)
				}
			}
		})
	}
}
