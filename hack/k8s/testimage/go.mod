module kfp-trainer.local/hack/k8s/testimage

go 1.26.0
