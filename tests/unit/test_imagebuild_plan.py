"""The Dockerfile interpretation of hack/k8s/imagebuild (pure: no file system, no process),
and that the images built on the test machines come from the Dockerfiles the release builds."""

from __future__ import annotations

import sys
from pathlib import Path

import dockerfile
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)
from imagebuild import base, plan  # noqa: E402

CONFIGS = {"python:3.11-slim": base.CONFIG}


def stages_of(text: str, build_args: dict | None = None) -> list[plan.Stage]:
    return plan.plan(dockerfile.parse_string(text), build_args or {}, CONFIGS, "Dockerfile.test")


@pytest.mark.parametrize(
    "word, expected",
    [
        ("$A", "1"),
        ("${A}x", "1x"),
        ("${MISSING:-d}", "d"),
        ("${A:-d}", "1"),
        ("${A:+set}", "set"),
        ("${MISSING:+set}", ""),
        ('"a b $A"', "a b 1"),
        ("'$A'", "$A"),
        (r"\$A", "$A"),
        ("pre-$B-post", "pre-two words-post"),
        ("$", "$"),
    ],
)
def test_expand_follows_docker_word_rules(word, expected):
    assert plan.expand(word, {"A": "1", "B": "two words"}) == expected


def test_expand_refuses_what_it_does_not_implement():
    with pytest.raises(plan.PlanError, match=r"\$\{A:\?x\}"):
        plan.expand("${A:?x}", {"A": "1"})
    with pytest.raises(plan.PlanError, match="unterminated"):
        plan.expand('"open', {})


def test_stages_args_env_user_workdir_and_copy_from():
    stages = stages_of(
        """ARG BASE=python:3.11-slim
ARG TAG
FROM python:3.11-slim AS build
WORKDIR /src
COPY a.txt b/ ./
RUN make
FROM ${BASE}
ARG EXTRAS="x y"
ARG TAG
ENV A=1 B="$EXTRAS"
ENV C=$A
COPY --from=build /wheels /wheels
USER 1000
WORKDIR app
RUN ["echo", "hi"]
RUN echo $A
LABEL k=v
CMD ["python3", "-V"]
""",
        {"TAG": "t1"},
    )
    build, image = stages
    assert (build.name, build.base_image, image.name, image.base_image) == ("build", "python:3.11-slim", None, "python:3.11-slim")
    mkdir, copy, run = build.steps
    assert mkdir == plan.Mkdir("/src", "WORKDIR /src")
    assert (copy.sources, copy.dest, copy.from_stage) == (("a.txt", "b/"), "/src/./", None)
    assert run.argv == ("/bin/sh", "-c", "make") and run.workdir == "/src" and run.user == "0"
    # ENV sees the stage's ARGs; the base image's Env comes first; a global ARG is re-imported by name
    assert image.env["B"] == "x y" and image.env["C"] == "1" and image.env["LANG"] == "C.UTF-8"
    copy_from, mkdir2, exec_run, shell_run = image.steps
    assert (copy_from.from_stage, copy_from.sources, copy_from.dest) == (0, ("/wheels",), "/wheels")
    assert mkdir2.path == "/app"
    assert exec_run.argv == ("echo", "hi") and exec_run.user == "1000" and exec_run.workdir == "/app"
    env = dict(shell_run.env)
    assert env["EXTRAS"] == "x y" and env["TAG"] == "t1" and env["A"] == "1"  # ARGs reach RUN, not the image
    assert "EXTRAS" not in image.env
    assert (image.user, image.workdir, image.labels, image.cmd) == ("1000", "/app", {"k": "v"}, ["python3", "-V"])


def test_a_build_argument_overrides_a_default():
    (stage,) = stages_of('FROM python:3.11-slim\nARG EXTRAS="a b"\nRUN echo $EXTRAS\n', {"EXTRAS": "c"})
    assert dict(stage.steps[0].env)["EXTRAS"] == "c"


def test_a_stage_from_an_earlier_stage_inherits_its_settings():
    first, second = stages_of("FROM python:3.11-slim AS one\nENV A=1\nUSER 7\nFROM one\nRUN true\n")
    assert second.base_stage == 0 and second.base_image is None
    assert second.env["A"] == "1" and second.steps[0].user == "7"


def test_entrypoint_clears_an_inherited_cmd():
    (stage,) = stages_of("FROM python:3.11-slim\nENTRYPOINT python3 -m x\n")
    assert stage.entrypoint == ["/bin/sh", "-c", "python3 -m x"] and stage.cmd is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("FROM python:3.11-slim\nADD x /x\n", r"Dockerfile.test:2: ADD is not implemented by this build \(supported: FROM, ARG"),
        ("FROM python:3.11-slim\nEXPOSE 80\n", "EXPOSE is not implemented"),
        ("FROM python:3.11-slim\nCOPY --chmod=755 a /a\n", r"--chmod=755: not implemented by this build \(supported: --from, --chown\)"),
        ("FROM python:3.11-slim\nRUN --mount=type=cache,target=/x true\n", "flags are not implemented for RUN"),
        ("FROM python:3.11-slim\nCOPY --from=nope /a /a\n", "COPY --from=nope: no earlier stage"),
        ("FROM python:3.11-slim\nCOPY ../secret /a\n", "outside the build context"),
        ("RUN true\n", "RUN before the first FROM"),
        ("FROM python:3.11-slim AS a\nFROM python:3.11-slim AS a\n", "used twice"),
        ("FROM python:3.11-slim\nARG A=1 B=2\n", "one ARG per instruction"),
    ],
)
def test_what_is_not_implemented_is_refused_with_file_and_line(text, message):
    with pytest.raises(plan.PlanError, match=message):
        stages_of(text)


def test_an_unknown_base_image_is_refused():
    with pytest.raises(base.BaseImageError, match=r"FROM debian:12: only \['python:3.11-slim'\] can be built here"):
        base.recipe("debian:12")


def test_the_base_recipe_digest_changes_with_the_recipe(monkeypatch):
    before = base.recipe_digest("python:3.11-slim")
    monkeypatch.setitem(base.RECIPES["python:3.11-slim"], "packages", [*base.PACKAGES, "curl"])
    assert base.recipe_digest("python:3.11-slim") != before


def test_the_test_images_are_built_from_the_dockerfiles_the_release_builds():
    release = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    matrix = {m["image"]: m["dockerfile"] for m in release["jobs"]["images"]["strategy"]["matrix"]["include"]}
    built = {repository.rsplit("/", 1)[1]: path for path, repository in images.IMAGES.values()}
    assert built == matrix


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_the_real_dockerfiles_install_dependencies_before_the_wheel(name):
    path, _ = images.IMAGES[name]
    stages = plan.parse(REPO / path, {}, CONFIGS)
    build, image = stages
    runs = [s for s in image.steps if isinstance(s, plan.Run)]
    copies = [s for s in image.steps if isinstance(s, plan.Copy)]
    # requirements (from pyproject, made in the build stage) -> heavy RUN -> wheel -> light RUN
    assert [c.sources for c in copies] == [("/src/requirements.txt",), ("/wheels",)]
    order = image.steps.index
    assert order(copies[0]) < order(runs[0]) < order(copies[1]) < order(runs[1])
    assert "-r /tmp/requirements.txt" in runs[0].argv[-1] and "kfp_trainer" not in runs[0].argv[-1]
    assert "--no-deps /wheels/kfp_trainer-" in runs[1].argv[-1]
    assert image.user == "1000" and image.env["PIP_NO_CACHE_DIR"] == "1"
