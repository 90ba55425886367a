// Command chi shows tollgate's middleware in a chi router: limiter.Handler
// has chi's middleware shape, func(http.Handler) http.Handler, so it goes
// into r.Use for the whole router or r.With for one route. This module has
// its own go.mod so that tollgate itself does not depend on chi.
//
//	cd examples/chi && go run . -addr 127.0.0.1:8081
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/httplimit"
	"github.com/tollgate/tollgate/memorystore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.Parse()
	r, err := router(memorystore.New())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv := &http.Server{Addr: *addr, Handler: r, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintln(os.Stderr, "listening on", *addr)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// router limits every route by client IP, and /search further by one
// global allowance shared by all clients.
func router(store tollgate.Store) (http.Handler, error) {
	perIP, err := httplimit.New(store, []httplimit.Rule{{
		Name:     "ip",
		Policies: []enforce.Policy{{Name: "ip", Limit: tollgate.PerSecond(5)}},
	}})
	if err != nil {
		return nil, err
	}
	search, err := httplimit.New(store, []httplimit.Rule{{
		Name:     "search",
		Key:      httplimit.Global(),
		Policies: []enforce.Policy{{Name: "search", Limit: tollgate.PerMinute(100)}},
	}})
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(perIP.Handler)
	r.Get("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s\n", chi.URLParam(r, "id"))
	})
	r.With(search.Handler).Get("/search", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "results")
	})
	return r, nil
}
