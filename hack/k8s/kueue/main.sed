# Applied to the module's cmd/kueue/main.go through go build -overlay (build.sh): with the
# internal certificate management off, the manager reads its metrics server certificate from
# a fixed /etc/kueue/metrics/certs; the test cluster gives it the webhook certificate
# directory of its configuration instead, so that nothing is needed under /etc on the host.
s|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := cfg.Webhook.CertDir|
