// What differs between the Trainer releases the wrapper builds, for Trainer v2.2.1 and
// JobSet v0.12.0: replaces ../release.go (Trainer v2.3.0). The v2.2 configuration API:
// config.Load takes enableHTTP2 and there is no ApplyClientConnection.

package main

import (
	"context"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	jobsetcontrollers "sigs.k8s.io/jobset/pkg/controllers"
	jobsetwebhooks "sigs.k8s.io/jobset/pkg/webhooks"

	trainerconfigapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
	trainerconfig "github.com/kubeflow/trainer/v2/pkg/config"
	trainerfeatures "github.com/kubeflow/trainer/v2/pkg/features"
	trainerruntime "github.com/kubeflow/trainer/v2/pkg/runtime"
	trainerruntimecore "github.com/kubeflow/trainer/v2/pkg/runtime/core"
)

// missingWebhooks names the webhook configurations (webhooks.go) this release does not serve.
var missingWebhooks []string

// reconciler is one of JobSet's controllers, ready to be added to the manager.
type reconciler interface {
	SetupWithManager(mgr ctrl.Manager) error
}

// loadTrainerConfig returns the Trainer's default manager options and configuration
// (client QPS, status server settings), without certificate management and with the
// status server on statusServerPort; the caller sets the listeners.
func loadTrainerConfig(statusServerPort int) (ctrl.Options, *trainerconfigapi.Configuration, error) {
	mgrOpts, cfg, err := trainerconfig.Load(scheme, "", false)
	if err != nil {
		return mgrOpts, nil, err
	}
	disabled := false
	cfg.CertManagement.Enable = &disabled
	port := int32(statusServerPort)
	cfg.StatusServer.Port = &port
	return mgrOpts, &cfg, nil
}

// applyClientConnection does nothing: v2.2.1 has no client connection settings to apply.
func applyClientConnection(*rest.Config, *trainerconfigapi.Configuration) {}

// statusServerEnabled reports whether the Trainer's status server runs (the TrainJobStatus gate).
func statusServerEnabled() bool {
	return trainerfeatures.Enabled(trainerfeatures.TrainJobStatus)
}

// newJobSetReconcilers returns JobSet's JobSet and Pod reconcilers with their event recorders.
func newJobSetReconcilers(mgr ctrl.Manager) (jobSet, pod reconciler) {
	return jobsetcontrollers.NewJobSetReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("jobset")),
		jobsetcontrollers.NewPodReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("pod"))
}

// setupJobSetWebhooks registers JobSet's webhooks with the manager's webhook server.
func setupJobSetWebhooks(mgr ctrl.Manager) error {
	return jobsetwebhooks.Setup(mgr)
}

// newRuntimes builds the Trainer's runtimes (the plugins of each runtime kind).
func newRuntimes(ctx context.Context, mgr ctrl.Manager, cfg *trainerconfigapi.Configuration) (map[string]trainerruntime.Runtime, error) {
	return trainerruntimecore.New(ctx, mgr.GetClient(), mgr.GetFieldIndexer(), cfg)
}
