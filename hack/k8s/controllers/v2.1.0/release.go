// What differs between the Trainer releases the wrapper builds, for Trainer v2.1.0 and
// JobSet v0.10.1: replaces ../release.go (Trainer v2.3.0). No feature gates of the
// Trainer and no status server (--status-server-port is accepted and unused; see
// statusserver.go here), no TrainJob defaulting webhook, no config.Load (it needs a file
// there), the runtimes take no configuration, the manager's client caches unstructured
// objects (as the release's own main does), JobSet's reconcilers take the older event
// recorder and its webhooks are set up one by one.

package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobsetcontrollers "sigs.k8s.io/jobset/pkg/controllers"
	jobsetwebhooks "sigs.k8s.io/jobset/pkg/webhooks"

	trainerconfigapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
	trainerruntime "github.com/kubeflow/trainer/v2/pkg/runtime"
	trainerruntimecore "github.com/kubeflow/trainer/v2/pkg/runtime/core"
)

// missingWebhooks names the webhook configurations (webhooks.go) this release does not
// serve: v2.1.0 has no TrainJob defaulting webhook.
var missingWebhooks = []string{"defaulter.trainer.kubeflow.org"}

// reconciler is one of JobSet's controllers, ready to be added to the manager.
type reconciler interface {
	SetupWithManager(mgr ctrl.Manager) error
}

// loadTrainerConfig returns empty manager options (the scheme, a client that caches
// unstructured objects) and an empty configuration: v2.1.0's config.Load without a file
// dereferences the unset webhook host, and what it would set (listeners, leader
// election) is all the caller's own here.
func loadTrainerConfig(int) (ctrl.Options, *trainerconfigapi.Configuration, error) {
	mgrOpts := ctrl.Options{
		Scheme: scheme,
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
	}
	return mgrOpts, &trainerconfigapi.Configuration{}, nil
}

// applyClientConnection does nothing: the client keeps controller-runtime's defaults.
func applyClientConnection(*rest.Config, *trainerconfigapi.Configuration) {}

// statusServerEnabled is false: v2.1.0 has no status server.
func statusServerEnabled() bool { return false }

// newJobSetReconcilers returns JobSet's JobSet and Pod reconcilers with their event recorders.
func newJobSetReconcilers(mgr ctrl.Manager) (jobSet, pod reconciler) {
	return jobsetcontrollers.NewJobSetReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorderFor("jobset")),
		jobsetcontrollers.NewPodReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorderFor("pod"))
}

// setupJobSetWebhooks registers JobSet v0.10.1's JobSet and Pod webhooks one by one.
func setupJobSetWebhooks(mgr ctrl.Manager) error {
	jobSetHook, err := jobsetwebhooks.NewJobSetWebhook(mgr.GetClient())
	if err != nil {
		return err
	}
	if err := jobSetHook.SetupWebhookWithManager(mgr); err != nil {
		return err
	}
	if err := jobsetwebhooks.NewPodWebhook(mgr.GetClient()).SetupWebhookWithManager(mgr); err != nil {
		return fmt.Errorf("pod webhook: %w", err)
	}
	return nil
}

// newRuntimes builds the Trainer's runtimes; v2.1.0's take no configuration.
func newRuntimes(ctx context.Context, mgr ctrl.Manager, _ *trainerconfigapi.Configuration) (map[string]trainerruntime.Runtime, error) {
	return trainerruntimecore.New(ctx, mgr.GetClient(), mgr.GetFieldIndexer())
}
