# Applied by build.sh to a copy of the module's cmd/kueue/main.go, built as the main package of a
# copy of this module: with the internal certificate management off, the manager reads its
# metrics server certificate from a fixed /etc/kueue/metrics/certs; the test cluster gives it the
# webhook certificate directory of its configuration instead, so nothing is needed under /etc.
s|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := cfg.Webhook.CertDir|
