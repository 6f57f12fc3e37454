// Trainer v2.1.0 has no status server: this file replaces ../statusserver.go.

package main

import (
	"context"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	trainerconfigapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
)

// setupStatusServer fails: never called, as statusServerEnabled is false for v2.1.0.
func setupStatusServer(context.Context, manager.Manager, *trainerconfigapi.Configuration, *certificates, int) error {
	return errors.New("Trainer v2.1.0 has no status server")
}
