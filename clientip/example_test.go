package clientip_test

import (
	"fmt"
	"net/http"

	"github.com/tollgate/tollgate/clientip"
)

// Behind a load balancer in 10.0.0.0/8 that appends to X-Forwarded-For.
func ExampleResolver_Key() {
	ips := clientip.MustNew(clientip.TrustProxies("10.0.0.0/8"))

	// Through the load balancer: the client tried to pass as 1.2.3.4.
	r := &http.Request{RemoteAddr: "10.0.0.9:40000", Header: http.Header{
		"X-Forwarded-For": {"1.2.3.4, 203.0.113.7"},
	}}
	fmt.Println(ips.Key(r))

	// Straight from the internet, with the same header: ignored.
	r.RemoteAddr = "198.51.100.9:40000"
	fmt.Println(ips.Key(r))

	// An IPv6 client is keyed by its /64.
	r.RemoteAddr = "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:40000"
	fmt.Println(ips.Key(r))
	// Output:
	// 203.0.113.7
	// 198.51.100.9
	// 2001:db8:1:2::/64
}
