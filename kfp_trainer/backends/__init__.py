"""Backends: places that run TrainJobs (a Kubernetes cluster, this machine)."""
