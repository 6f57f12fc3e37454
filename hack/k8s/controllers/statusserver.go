package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"unsafe"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	trainerconfigapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
	"github.com/kubeflow/trainer/v2/pkg/statusserver"
)

// Where the Trainer (TrainJobStatus plugin) reads the CA it hands to trainer pods:
// the secret of its certificate manager, in its operator namespace (defaults).
const (
	operatorNamespace = "kubeflow-system"
	webhookSecretName = "kubeflow-trainer-webhook-cert"
)

// setupStatusServer runs the Trainer's status server (the TrainJobStatus feature) on
// 127.0.0.1:port with our serving certificate.
//
// Two things differ from the Trainer's own setup, both because the process does not
// run in a pod: tokens are checked with the TokenReview API (signature, expiry, the
// TrainJob's audience and the namespace of the token's service account, which is what
// the Trainer's OIDC check verifies) instead of OIDC discovery from an in-pod token;
// and the server binds the loopback address only.
func setupStatusServer(ctx context.Context, mgr manager.Manager, cfg *trainerconfigapi.Configuration, certs *certificates, port int) error {
	if err := publishCA(ctx, mgr, certs); err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certs.certPEM, certs.keyPEM)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	cli, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	srv, err := statusserver.NewServer(cli, cfg.StatusServer, tlsConfig, tokenReviewAuthorizer{cs})
	if err != nil {
		return err
	}
	if err := bindLoopback(srv, port); err != nil {
		return err
	}
	return mgr.Add(srv)
}

// publishCA stores the CA where the Trainer's TrainJobStatus plugin looks for it.
func publishCA(ctx context.Context, mgr manager.Manager, certs *certificates) error {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: webhookSecretName, Namespace: operatorNamespace},
		Data:       map[string][]byte{"ca.crt": certs.caPEM, "tls.crt": certs.certPEM, "tls.key": certs.keyPEM},
	}
	return upsert(ctx, c, secret, &corev1.Secret{})
}

// bindLoopback makes the status server listen on 127.0.0.1 only: the Trainer's server
// binds ":<port>" and keeps its http.Server unexported, so the address is set on it
// directly. Fails (instead of binding every interface) if the field is not there.
func bindLoopback(srv *statusserver.Server, port int) error {
	field := reflect.ValueOf(srv).Elem().FieldByName("httpServer")
	if !field.IsValid() || field.Type() != reflect.TypeOf(&http.Server{}) {
		return fmt.Errorf("statusserver.Server has no *http.Server field httpServer; cannot bind it to 127.0.0.1")
	}
	hs := *(**http.Server)(unsafe.Pointer(field.UnsafeAddr()))
	if hs == nil {
		return fmt.Errorf("statusserver.Server has no http.Server")
	}
	hs.Addr = loopback(port)
	return nil
}

type tokenReviewAuthorizer struct{ cs kubernetes.Interface }

var _ statusserver.TokenAuthorizer = tokenReviewAuthorizer{}

func (tokenReviewAuthorizer) Init(context.Context) error { return nil }

func (a tokenReviewAuthorizer) Authorize(ctx context.Context, authHeader, namespace, trainJobName string) (bool, error) {
	parts := strings.Fields(authHeader)
	if len(parts) != 2 || !strings.EqualFold(parts[0], "Bearer") {
		return false, nil
	}
	audience := statusserver.TokenAudience(namespace, trainJobName)
	review, err := a.cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: parts[1], Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	st := review.Status
	if !st.Authenticated || !contains(st.Audiences, audience) {
		return false, nil
	}
	return strings.HasPrefix(st.User.Username, "system:serviceaccount:"+namespace+":"), nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
