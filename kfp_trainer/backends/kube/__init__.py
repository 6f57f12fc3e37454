"""The Kubernetes backend's parts, one concern per module.

* ``rest`` -- the REST client: JSON over one urllib3 pool, no generated models;
* ``kubeconfig`` -- its settings from the pod's service account or a kubeconfig (the client
  library's loader for exec plugins and auth providers);
* ``objects`` -- custom objects and pods as dicts;
* ``api`` -- every API call: one error mapping, one retry policy;
* ``watch`` -- list + watch from ``resourceVersion``, relist on 410, bounded "wait until gone";
* ``cache`` -- watches in a thread: an object cache, an event queue with heartbeats;
* ``discovery`` -- the API client, default namespace, Trainer API version, runtimes;
* ``lifecycle`` -- create, adopt, replace, delete (nothing left behind);
* ``logs`` -- one trainer node's log, without loss or repeats;
* ``inspect`` -- why a job cannot start, and why it failed.

:class:`kfp_trainer.backends.kubernetes.KubernetesBackend` puts them together.
"""
