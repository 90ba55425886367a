package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/service"
)

// The admin API (internal/service: AdminHandler) on a listener of its own,
// off unless --admin is set; and `tollgate admin`, its client.

// adminFlags are serve's flags for the admin API.
type adminFlags struct {
	addr, tokenFile string
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.addr, "admin", "", "address of the admin API, which looks at and resets counters (off by default; keep it on loopback or a private network); needs --admin-token-file")
	fs.StringVar(&a.tokenFile, "admin-token-file", "", "file of the admin API's bearer tokens: one per line, as NAME TOKEN (the name is what the logs show), or a lone TOKEN; at least 16 bytes each")
}

func (a *adminFlags) check() error {
	switch {
	case a.addr == "" && a.tokenFile != "":
		return errors.New("--admin-token-file needs --admin")
	case a.addr != "" && a.tokenFile == "":
		return errors.New("--admin needs --admin-token-file: the admin API is never open without a token")
	}
	return nil
}

// maxAdminTokens bounds the token file: it is read whole at start.
const maxAdminTokens = 64

// readAdminTokens reads the token file: regular, at most tlsMaxFileBytes,
// its contents never in an error.
func readAdminTokens(path string) ([]service.AdminToken, error) {
	b, err := readTLSFile("--admin-token-file", path)
	if err != nil {
		return nil, err
	}
	var tokens []service.AdminToken
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		t := service.AdminToken{Name: "admin", Token: line}
		if name, token, ok := strings.Cut(line, " "); ok {
			t = service.AdminToken{Name: name, Token: strings.TrimSpace(token)}
		}
		if len(t.Token) < 16 {
			return nil, fmt.Errorf("--admin-token-file %s:%d: a token of at least 16 bytes is needed", path, n)
		}
		if len(tokens) == maxAdminTokens {
			return nil, fmt.Errorf("--admin-token-file %s: more than %d tokens", path, maxAdminTokens)
		}
		tokens = append(tokens, t)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("--admin-token-file %s: no token", path)
	}
	return tokens, nil
}

// serve starts the admin API for srv, or does nothing without --admin.
func (a *adminFlags) serve(srv *service.Server, conns *connFlags, log *slog.Logger) (*http.Server, error) {
	if a.addr == "" {
		return nil, nil
	}
	tokens, err := readAdminTokens(a.tokenFile)
	if err != nil {
		return nil, err
	}
	h, err := srv.AdminHandler(tokens)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", a.addr)
	if err != nil {
		return nil, err
	}
	hs := conns.debugServer(h, log)
	go hs.Serve(l)
	log.Info("admin API listening", "addr", l.Addr().String(), "tokens", len(tokens))
	return hs, nil
}

func init() {
	register(command{
		name:    "admin",
		summary: "look at or reset a counter through a running service's admin API",
		run:     runAdmin,
	})
}

// runAdmin is `tollgate admin counter|reset`.
func runAdmin(ctx context.Context, args []string, _ env, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "http://127.0.0.1:8082", "the admin API's base URL (serve --admin)")
	tokenFile := fs.String("token-file", "", "a file whose first token is sent (as --admin-token-file holds them)")
	domain := fs.String("domain", "", "the descriptor's domain")
	var entries multiFlag
	fs.Var(&entries, "entry", "a descriptor entry KEY=VALUE, repeated in order")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tollgate admin counter|reset --token-file FILE --domain NAME --entry KEY=VALUE [--entry ...] [--addr URL]")
		fs.PrintDefaults()
	}
	if len(args) == 0 || (args[0] != "counter" && args[0] != "reset") {
		fs.Usage()
		return 2
	}
	action := args[0]
	if code, ok := parseFlags(fs, args[1:], stderr); !ok {
		return code
	}
	if *tokenFile == "" || *domain == "" || len(entries) == 0 {
		fmt.Fprintln(stderr, "tollgate admin: --token-file, --domain and at least one --entry are needed")
		return 2
	}
	tokens, err := readAdminTokens(*tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate admin: %v\n", err)
		return 2
	}
	q := url.Values{"domain": {*domain}, "entry": entries}
	method, path := http.MethodGet, "/v1/counter"
	if action == "reset" {
		method, path = http.MethodPost, "/v1/counter/reset"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(*addr, "/")+path+"?"+q.Encode(), nil)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate admin: %v\n", err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+tokens[0].Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "tollgate admin: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	stdout.Write(body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "tollgate admin: %s\n", resp.Status)
		return 1
	}
	return 0
}
