"""``make bench``: kfp-trainer and the kubeflow SDK measured side by side (see bench/run.py)."""
