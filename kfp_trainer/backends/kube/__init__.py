"""The Kubernetes backend's parts, one concern per module.

* ``client`` -- the one HTTP client: ``request(method, path, ...)``, JSON over one urllib3 pool;
* ``apierrors`` -- the server's refusals as typed errors (status, reason, details kept);
* ``credentials`` -- the pod's service account, or a kubeconfig read by the client library's loader;
* ``proxy`` -- which proxy a request goes through (``proxy-url``, ``HTTPS_PROXY``, ``NO_PROXY``);
* ``paths`` -- the URL paths of the objects the backend touches;
* ``api`` -- every API call: one error mapping, one retry policy;
* ``watch`` -- list + watch from ``resourceVersion``, relist on 410, bounded "wait until gone";
* ``cache`` -- watches in a thread: an object cache, an event queue with heartbeats;
* ``discovery`` -- the API client, default namespace, Trainer API version, runtimes;
* ``lifecycle`` -- create, adopt, replace, delete (nothing left behind);
* ``logs`` -- one trainer node's log, without loss or repeats;
* ``inspect`` -- why a job cannot start, and why it failed.

:class:`kfp_trainer.backends.kubernetes.KubernetesBackend` puts them together.
"""
