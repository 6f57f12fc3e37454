"""Finding the latest complete torchtune checkpoint and the overrides that resume from it."""

from __future__ import annotations

import os
import zipfile

from kfp_trainer.llm.checkpoints import RECIPE_STATE, Listing, complete_epochs, resume_overrides, resume_plan, scan

SHARD = "model-00001-of-00001.safetensors"


def full_epoch(e: int, t: int, shards: int = 1) -> dict[str, int]:
    files = {f"epoch_{e}/model-{i:05d}-of-{shards:05d}.safetensors": t for i in range(1, shards + 1)}
    files.update({f"epoch_{e}/model.safetensors.index.json": t + 1, f"epoch_{e}/config.json": 1})
    return files


def lora_epoch(e: int, t: int) -> dict[str, int]:
    return {
        **full_epoch(e, t),
        f"epoch_{e}/adapter_model.pt": t + 2,
        f"epoch_{e}/adapter_model.safetensors": t + 3,
        f"epoch_{e}/adapter_config.json": t + 4,
    }


def test_a_run_killed_during_epoch_two_resumes_after_epoch_one_with_its_files():
    listing = Listing.of({**full_epoch(0, 10), RECIPE_STATE: 20})
    plan = resume_plan(listing, total_epochs=3)
    assert plan.epochs_done == 1 and not plan.finished
    assert plan.overrides == [
        "resume_from_checkpoint=True",
        f"checkpointer.checkpoint_files=[epoch_0/{SHARD}]",
        "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt",
    ]


def test_every_shard_of_a_sharded_model_is_named_in_order():
    listing = Listing.of({**full_epoch(0, 10, shards=2), RECIPE_STATE: 20})
    assert resume_plan(listing).overrides[1] == (
        "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00002.safetensors,epoch_0/model-00002-of-00002.safetensors]"
    )


def test_a_half_written_epoch_is_skipped_for_the_one_before():
    partial = {"epoch_1/model-00001-of-00002.safetensors": 30}  # killed mid-save: no second shard, no index
    listing = Listing.of({**full_epoch(0, 10, shards=2), RECIPE_STATE: 20, **partial})
    plan = resume_plan(listing, total_epochs=3)
    assert plan.epochs_done == 1 and plan.checkpoint.folder == "epoch_0"


def test_an_epoch_whose_recipe_state_was_not_yet_written_is_not_resumed_from():
    # Killed after epoch_1's files but before recipe_state.pt was rewritten: that state belongs to epoch 0.
    listing = Listing.of({**full_epoch(0, 10), RECIPE_STATE: 20, **full_epoch(1, 30)})
    plan = resume_plan(listing, total_epochs=3)
    assert plan.epochs_done == 1 and plan.checkpoint.folder == "epoch_0"


def test_a_recipe_state_cut_off_mid_write_means_starting_over():
    listing = Listing.of({**full_epoch(0, 10), RECIPE_STATE: 20}, broken=(RECIPE_STATE,))
    plan = resume_plan(listing, total_epochs=3)
    assert plan.epochs_done == 0 and plan.overrides == []


def test_nothing_written_yet_means_starting_over():
    assert resume_plan(Listing.of({"logs/log_1.txt": 5})).overrides == []


def test_a_complete_last_epoch_means_the_run_finished():
    listing = Listing.of({**full_epoch(0, 10), RECIPE_STATE: 20, **full_epoch(1, 30)})
    plan = resume_plan(listing, total_epochs=2)
    assert plan.finished and plan.overrides == [] and plan.final.folder == "epoch_1"


def test_lora_runs_resume_from_the_adapter_and_need_it_complete():
    listing = Listing.of({**lora_epoch(0, 10), RECIPE_STATE: 20})
    plan = resume_plan(listing, total_epochs=2)
    assert plan.checkpoint.adapter
    assert plan.overrides[1] == "checkpointer.adapter_checkpoint=epoch_0/adapter_model.pt"
    no_config = {k: v for k, v in lora_epoch(0, 10).items() if not k.endswith("adapter_config.json")}
    assert complete_epochs(Listing.of(no_config), adapter=True) == []


def test_resume_overrides_are_relative_to_output_dir():
    [ckpt] = complete_epochs(Listing.of(full_epoch(4, 10)))
    assert resume_overrides(ckpt)[1] == f"checkpointer.checkpoint_files=[epoch_4/{SHARD}]"


def test_scan_reads_real_files_and_spots_a_truncated_recipe_state(tmp_path):
    out = tmp_path / "output"
    for rel in full_epoch(0, 0):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    state = out / RECIPE_STATE
    state.parent.mkdir(parents=True)
    with zipfile.ZipFile(state, "w") as z:
        z.writestr("recipe_state/data.pkl", b"state")
    os.utime(state, ns=(2**62, 2**62))  # written after the epoch's files
    plan = resume_plan(scan(out), total_epochs=3)
    assert plan.epochs_done == 1
    state.write_bytes(state.read_bytes()[:20])  # cut off mid-write
    os.utime(state, ns=(2**62, 2**62))
    assert resume_plan(scan(out), total_epochs=3).epochs_done == 0


def test_scan_of_a_missing_dir_is_empty(tmp_path):
    assert scan(tmp_path / "nope").files == {}
