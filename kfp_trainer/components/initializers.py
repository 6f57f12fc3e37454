# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``dataset_initializer`` and ``model_initializer`` components.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.run_initializer` inside the component's container.
"""

from typing import Optional

from kfp import dsl
from kfp.dsl import Dataset, Model, Output

from ._image import BASE_IMAGE
from .calls import with_run_context


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def dataset_initializer(
    dataset: Output[Dataset],
    uri: str,
    ignore_patterns: Optional[list] = None,
):
    """Fetches a dataset into a Dataset artifact.

    Sources: builtin://datasets/<name> (generated offline), file:// or local paths (e.g. on
    the pipeline workspace), hf://<org>/<name>[@<revision>] (Hugging Face Hub) and
    s3://<bucket>/<prefix>. Credentials come from the step's environment only (HF_TOKEN;
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL), e.g. set from a Secret with
    kfp.kubernetes.use_secret_as_env; they are never logged. Without network access an
    hf:// source fails at once with a clear message.

    Args:
        uri: Where the dataset comes from.
        ignore_patterns: Glob patterns of files to skip (hf:// and s3://).

    Returns:
        dataset: The dataset files, with metadata: source_uri, files, bytes, splits (the split names its files show, e.g. test,train).
    """
    from kfp_trainer import steps

    steps.exit_on_error(lambda: steps.run_initializer(uri=uri, kind="dataset", output=dataset, ignore_patterns=ignore_patterns))


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def model_initializer(
    model: Output[Model],
    uri: str,
    ignore_patterns: Optional[list] = None,
):
    """Fetches a model into a Model artifact.

    Sources: builtin://models/<name> (generated offline), file:// or local paths (e.g. on the
    pipeline workspace), hf://<org>/<name>[@<revision>] (Hugging Face Hub) and
    s3://<bucket>/<prefix>. Credentials come from the step's environment only (HF_TOKEN;
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL), e.g. set from a Secret with
    kfp.kubernetes.use_secret_as_env; they are never logged. Without network access an
    hf:// source fails at once with a clear message.

    Args:
        uri: Where the model comes from.
        ignore_patterns: Glob patterns of files to skip (hf:// and s3://), e.g. ["*.bin"].

    Returns:
        model: The model files, with metadata: source_uri, weights, format, files, bytes.
    """
    from kfp_trainer import steps

    steps.exit_on_error(lambda: steps.run_initializer(uri=uri, kind="model", output=model, ignore_patterns=ignore_patterns))


dataset_initializer = with_run_context(dataset_initializer)
model_initializer = with_run_context(model_initializer)
