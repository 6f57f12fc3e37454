// Command coredns is the test cluster's DNS server: CoreDNS with only the plugins the real
// node's pods need (headless Service and pod names under cluster.local), nothing that
// reaches outside the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, registered by their init functions.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which a query passes the plugins of a server block (CoreDNS's own order).
var directives = []string{"bind", "ready", "errors", "log", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
