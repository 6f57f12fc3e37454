package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// The webhook configurations of a Trainer v2.3.0 and a JobSet v0.12.0 install, with
// their upstream names, webhook names, paths, rules and selectors, but reached by URL.
type hook struct {
	name       string
	path       string
	group      string
	version    string
	resource   string
	operations []admissionv1.OperationType
	selector   *metav1.LabelSelector
}

var (
	createOnly     = []admissionv1.OperationType{admissionv1.Create}
	createUpdate   = []admissionv1.OperationType{admissionv1.Create, admissionv1.Update}
	jobSetPods     = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "jobset.sigs.k8s.io/jobset-name", Operator: metav1.LabelSelectorOpExists}}}
	runtimeEnabled = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "trainer.kubeflow.org/webhook-validation", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"disabled"}}}}

	mutating = map[string][]hook{
		"defaulter.trainer.kubeflow.org": {
			{"defaulter.trainjob.trainer.kubeflow.org", "/mutate-trainer-kubeflow-org-v1alpha1-trainjob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", createUpdate, nil},
		},
		"jobset-mutating-webhook-configuration": {
			{"mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets", createOnly, nil},
			{"mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", createOnly, jobSetPods},
		},
	}
	validating = map[string][]hook{
		"validator.trainer.kubeflow.org": {
			{"validator.clustertrainingruntime.trainer.kubeflow.org", "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime", "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", createUpdate, runtimeEnabled},
			{"validator.trainingruntime.trainer.kubeflow.org", "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime", "trainer.kubeflow.org", "v1alpha1", "trainingruntimes", createUpdate, runtimeEnabled},
			{"validator.trainjob.trainer.kubeflow.org", "/validate-trainer-kubeflow-org-v1alpha1-trainjob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", createUpdate, nil},
		},
		"jobset-validating-webhook-configuration": {
			{"vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "v1alpha2", "jobsets", createUpdate, nil},
			{"vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", createOnly, jobSetPods},
		},
	}
)

func (h hook) clientConfig(base string, caBundle []byte) admissionv1.WebhookClientConfig {
	url := base + h.path
	return admissionv1.WebhookClientConfig{URL: &url, CABundle: caBundle}
}

func (h hook) rules() []admissionv1.RuleWithOperations {
	return []admissionv1.RuleWithOperations{{
		Operations: h.operations,
		Rule: admissionv1.Rule{
			APIGroups:   []string{h.group},
			APIVersions: []string{h.version},
			Resources:   []string{h.resource},
		},
	}}
}

// webhookRegistrar points the webhook configurations at this process once its webhook
// server listens and its caches are synced, then closes registered.
type webhookRegistrar struct {
	mgr        manager.Manager
	url        string
	caBundle   []byte
	registered chan struct{}
}

var _ manager.LeaderElectionRunnable = (*webhookRegistrar)(nil)

func (r *webhookRegistrar) NeedLeaderElection() bool { return false }

func (r *webhookRegistrar) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("webhook-registrar")
	started := r.mgr.GetWebhookServer().StartedChecker()
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	for started(req) != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !r.mgr.GetCache().WaitForCacheSync(ctx) {
		return nil
	}
	c, err := client.New(r.mgr.GetConfig(), client.Options{Scheme: r.mgr.GetScheme()})
	if err != nil {
		return err
	}
	fail := admissionv1.Fail
	none := admissionv1.SideEffectClassNone
	for {
		err = r.register(ctx, c, fail, none)
		if err == nil {
			break
		}
		log.Error(err, "registering webhook configurations; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	log.Info("webhook configurations registered", "url", r.url)
	close(r.registered)
	return nil
}

func (r *webhookRegistrar) register(ctx context.Context, c client.Client, fail admissionv1.FailurePolicyType, none admissionv1.SideEffectClass) error {
	for name, hooks := range mutating {
		obj := &admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, h := range hooks {
			obj.Webhooks = append(obj.Webhooks, admissionv1.MutatingWebhook{
				Name:                    h.name,
				ClientConfig:            h.clientConfig(r.url, r.caBundle),
				Rules:                   h.rules(),
				FailurePolicy:           &fail,
				SideEffects:             &none,
				ObjectSelector:          h.selector,
				AdmissionReviewVersions: []string{"v1"},
			})
		}
		if err := upsert(ctx, c, obj, &admissionv1.MutatingWebhookConfiguration{}); err != nil {
			return err
		}
	}
	for name, hooks := range validating {
		obj := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, h := range hooks {
			obj.Webhooks = append(obj.Webhooks, admissionv1.ValidatingWebhook{
				Name:                    h.name,
				ClientConfig:            h.clientConfig(r.url, r.caBundle),
				Rules:                   h.rules(),
				FailurePolicy:           &fail,
				SideEffects:             &none,
				ObjectSelector:          h.selector,
				AdmissionReviewVersions: []string{"v1"},
			})
		}
		if err := upsert(ctx, c, obj, &admissionv1.ValidatingWebhookConfiguration{}); err != nil {
			return err
		}
	}
	return nil
}

// upsert creates obj, or replaces the existing object of that name (a restarted
// process serves the webhooks with a new CA and maybe a new port).
func upsert(ctx context.Context, c client.Client, obj, current client.Object) error {
	err := c.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), current); err != nil {
		return err
	}
	obj.SetResourceVersion(current.GetResourceVersion())
	if err := c.Update(ctx, obj); err != nil {
		return fmt.Errorf("update %s: %w", obj.GetName(), err)
	}
	return nil
}
