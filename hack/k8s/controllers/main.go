// Command controllers runs the Kubeflow Trainer and JobSet controllers, with their
// admission webhooks, in one controller-runtime manager for the test control plane.
//
// Everything listens on 127.0.0.1: the webhooks are served with a CA and serving
// certificate made at the first start and registered with the API server by URL, so no
// Service, cert-manager or in-cluster certificate rotation is needed. There is no
// leader election (one instance per cluster).
//
//	controllers --kubeconfig K --cert-dir D --webhook-port P --health-port H \
//	    [--metrics-port M] [--feature-gates TrainJobStatus=true --status-server-port S]
//
// This file is the same for every Trainer release built (hack/k8s/build.sh): what
// differs between their APIs lives in release.go (Trainer v2.3.0 here; an older
// release's overlay folder, hack/k8s/controllers/<version>/, brings its own).
//
// Readiness (GET http://127.0.0.1:H/readyz) turns OK once the webhook server
// listens and the webhook configurations point at it.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"

	"go.uber.org/zap/zapcore"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	jobsetv1alpha2 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	jobsetcontrollers "sigs.k8s.io/jobset/pkg/controllers"
	schedulerpluginsv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	volcanov1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainerconfigapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
	trainerv1alpha1 "github.com/kubeflow/trainer/v2/pkg/apis/trainer/v1alpha1"
	trainercontroller "github.com/kubeflow/trainer/v2/pkg/controller"
	trainerwebhooks "github.com/kubeflow/trainer/v2/pkg/webhooks"
)

var (
	scheme   = apiruntime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainerconfigapi.AddToScheme(scheme))
	utilruntime.Must(trainerv1alpha1.AddToScheme(scheme))
	utilruntime.Must(jobsetv1alpha2.AddToScheme(scheme))
	utilruntime.Must(schedulerpluginsv1alpha1.AddToScheme(scheme))
	utilruntime.Must(volcanov1beta1.AddToScheme(scheme))
}

type options struct {
	certDir          string
	webhookPort      int
	healthPort       int
	metricsPort      int
	statusServerPort int
	featureGates     string
}

func main() {
	var o options
	// controller-runtime registers --kubeconfig itself (ctrl.GetConfig reads it).
	flag.StringVar(&o.certDir, "cert-dir", "", "directory of the CA and serving certificate, made at the first start (required)")
	flag.IntVar(&o.webhookPort, "webhook-port", 0, "port of the webhook server on 127.0.0.1 (required)")
	flag.IntVar(&o.healthPort, "health-port", 0, "port of /healthz and /readyz on 127.0.0.1 (required)")
	flag.IntVar(&o.metricsPort, "metrics-port", 0, "port of the (plain HTTP) metrics endpoint on 127.0.0.1; 0 disables it")
	flag.IntVar(&o.statusServerPort, "status-server-port", 0,
		"port of the Trainer status server on 127.0.0.1 (used when the TrainJobStatus gate is on)")
	flag.StringVar(&o.featureGates, "feature-gates", "",
		"comma-separated key=value feature gates of both controllers, e.g. TrainJobStatus=true")
	zapOpts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	if err := run(o); err != nil {
		setupLog.Error(err, "controllers stopped")
		os.Exit(1)
	}
}

func run(o options) error {
	if o.certDir == "" || o.webhookPort == 0 || o.healthPort == 0 {
		return fmt.Errorf("--cert-dir, --webhook-port and --health-port are required")
	}
	if o.featureGates != "" {
		// Trainer and JobSet register their gates in the same global gate set.
		if err := utilfeature.DefaultMutableFeatureGate.Set(o.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	for _, name := range missingWebhooks {
		delete(mutating, name)
		delete(validating, name)
	}
	statusServer := statusServerEnabled()
	if statusServer && o.statusServerPort == 0 {
		return fmt.Errorf("the TrainJobStatus gate needs --status-server-port")
	}

	certs, err := newCertificates(o.certDir)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}

	// The release's manager options and Trainer configuration, with our own listeners.
	mgrOpts, cfg, err := loadTrainerConfig(o.statusServerPort)
	if err != nil {
		return fmt.Errorf("trainer configuration: %w", err)
	}
	mgrOpts.LeaderElection = false
	mgrOpts.HealthProbeBindAddress = loopback(o.healthPort)
	mgrOpts.Metrics = metricsserver.Options{BindAddress: "0"}
	if o.metricsPort != 0 {
		mgrOpts.Metrics = metricsserver.Options{BindAddress: loopback(o.metricsPort)}
	}
	mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{
		Host:    "127.0.0.1",
		Port:    o.webhookPort,
		CertDir: o.certDir,
	})

	restCfg := ctrl.GetConfigOrDie()
	applyClientConnection(restCfg, cfg)
	mgr, err := ctrl.NewManager(restCfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()

	// JobSet (its main.go, without the certificate manager).
	if err := jobsetcontrollers.SetupJobSetIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("jobset indexes: %w", err)
	}
	if err := jobsetcontrollers.SetupPodIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("jobset pod indexes: %w", err)
	}
	jobSetReconciler, podReconciler := newJobSetReconcilers(mgr)
	if err := jobSetReconciler.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("jobset controller: %w", err)
	}
	if err := podReconciler.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("jobset pod controller: %w", err)
	}
	if err := setupJobSetWebhooks(mgr); err != nil {
		return fmt.Errorf("jobset webhooks: %w", err)
	}

	// Trainer (its cmd/trainer-controller-manager, without the certificate manager).
	runtimes, err := newRuntimes(ctx, mgr, cfg)
	if err != nil {
		return fmt.Errorf("trainer runtimes: %w", err)
	}
	if name, err := trainercontroller.SetupControllers(mgr, runtimes, ctrlcontroller.Options{}); err != nil {
		return fmt.Errorf("trainer controller %s: %w", name, err)
	}
	if name, err := trainerwebhooks.Setup(mgr, runtimes); err != nil {
		return fmt.Errorf("trainer webhook %s: %w", name, err)
	}
	if statusServer {
		if err := setupStatusServer(ctx, mgr, cfg, certs, o.statusServerPort); err != nil {
			return fmt.Errorf("trainer status server: %w", err)
		}
	}

	registered := make(chan struct{})
	if err := mgr.Add(&webhookRegistrar{
		mgr:        mgr,
		url:        "https://" + loopback(o.webhookPort),
		caBundle:   certs.caPEM,
		registered: registered,
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", func(*http.Request) error {
		select {
		case <-registered:
			return nil
		default:
			return fmt.Errorf("webhook configurations not registered yet")
		}
	}); err != nil {
		return err
	}
	setupLog.Info("starting manager", "webhooks", loopback(o.webhookPort), "statusServer", statusServer)
	return mgr.Start(ctx)
}

func loopback(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
