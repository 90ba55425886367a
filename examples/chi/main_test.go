package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/memorystore"
)

// The middleware in chi's Use and With: headers on every response, 429 past
// the per-IP limit, and chi's routing (URL params) untouched.
func TestChi(t *testing.T) {
	r, err := router(memorystore.New())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	var codes []int
	for i := 0; i < 50 && (len(codes) == 0 || codes[len(codes)-1] != 429); i++ {
		resp, err := http.Get(srv.URL + "/items/42")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.Header.Get("RateLimit") == "" {
			t.Errorf("request %d: no RateLimit header", i+1)
		}
	}
	if codes[0] != 200 || codes[len(codes)-1] != 429 {
		t.Errorf("statuses %v: want 200 first, then 429 past 5 per second", codes)
	}
	resp, err := http.Get(srv.URL + "/search")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// /search is behind both limiters; the per-IP one already denies.
	if resp.StatusCode != 429 {
		t.Errorf("/search: %d, want 429 from the per-IP limit", resp.StatusCode)
	}
}
