"""The check that a log holds no warning of ours (tests/our_warnings.py) finds them, and only them."""

from __future__ import annotations

from tests.our_warnings import ours

# As a train step's log showed it in KFP's UI (the trainer image's digits trainer, before it stopped calling float() on a loss).
STEP_LOG = """[kfp-trainer] trainer is running
[W1207 04:18:16.154876372 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
/usr/local/lib/python3.11/dist-packages/kfp_trainer/trainers/digits.py:186: UserWarning: Converting a tensor with requires_grad=True \
to a scalar may lead to unexpected behavior.
Consider using tensor.detach() first. (Triggered internally at /__w/pytorch/pytorch/torch/csrc/autograd/generated/\
python_variable_methods.cpp:820.)
  total += torch.tensor([float(loss) * len(batch), len(batch)])
{"epoch": 1, "loss": 2.114041, "val_loss": 1.605088, "val_accuracy": 0.799257}
"""


def test_a_warning_charged_to_a_file_of_ours_is_found():
    assert ours(STEP_LOG) == [STEP_LOG.splitlines()[2]]


def test_kfp_locals_runner_notes_count_as_ours_and_other_libraries_warnings_do_not():
    text = (
        "/venv/lib/python3.11/site-packages/kfp/local/subprocess_task_handler.py:81: RuntimeWarning: You may be attemping ...\n"
        "    /venv/lib/python3.11/site-packages/torchao/dtypes/__init__.py:25: DeprecationWarning: Importing ...\n"
        "[node-0] /venv/lib/python3.11/site-packages/transformers/trainer.py:10: FutureWarning: `tokenizer` is deprecated\n"
        "[node-1] /work/kfp_trainer/trainers/sft.py:12: Warning: plain\n"
    )
    assert ours(text) == [
        "/venv/lib/python3.11/site-packages/kfp/local/subprocess_task_handler.py:81: RuntimeWarning: You may be attemping ...",
        "[node-1] /work/kfp_trainer/trainers/sft.py:12: Warning: plain",
    ]
    assert ours(STEP_LOG.replace("kfp_trainer/trainers", "elsewhere")) == []
