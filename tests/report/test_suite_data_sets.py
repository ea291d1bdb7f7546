"""The answer suite across data sets and architectures: each row names its data
set, and the readings that combine studies (the two-factor fit, the budget families compared)
never mix members of different data sets or architectures."""

import dataclasses
import os
import re

import numpy as np

from wide_tf.analysis import simulate
from wide_tf.report import answer
from wide_tf.store import workdir as wd
from wide_tf.study import suite_runner


def _config(data, pool=1, num_train=0, model="mlp"):
    """The fields of a study's config.json that `study_kind` reads (test_study_kind_of_real_
    configs checks they are the real configs' fields)."""
    return {"data": {"name": data, "pool": pool, "num_train": num_train}, "model": {"arch": model}}


def test_study_kind_of_real_configs():
    """On the configs the data_sets suite runs, as config.json holds them: the ResNets and the
    MLPs on the same 7x7 MNIST are two kinds (the two-factor fit once mixed them: it read a
    field config.json does not have)."""
    from wide_tf.checks import loader

    def kind(spec):
        return answer.study_kind(loader.load_config(spec).to_dict())

    assert kind("configs/mlp.py:mnist7") == ("mnist_embedded 7x7", "mlp")
    assert kind("configs/wrn.py:mnist7") == ("mnist_embedded 7x7", "wrn")
    assert kind("configs/mlp.py:fashion7") == ("fashion_mnist_idx 7x7, 16000 images", "mlp")
    assert kind("configs/wrn.py:fashion7") == ("fashion_mnist_idx 7x7, 8000 images", "wrn")
    assert kind("configs/mlp.py:local") == ("digits_embedded", "mlp")


def test_study_kind_names_the_pooling_and_the_subset():
    kind = answer.study_kind
    assert kind(_config("mnist_embedded", pool=4)) == ("mnist_embedded 7x7", "mlp")
    assert kind(_config("fashion_mnist_idx", 4, 16000, "wrn")) == (
        "fashion_mnist_idx 7x7, 16000 images",
        "wrn",
    )
    assert kind(_config("digits_embedded")) == ("digits_embedded", "mlp")
    assert kind(None) == ("-", "-")


def test_two_data_sets_are_read_apart(tmp_path):
    """A budget and a width family on one data set (B_crit ~ width), a budget MLP and a budget
    WRN on another (no effect): one two-factor fit (the first data set's), never one over both;
    the other budget families compared with the first, each labelled with what differs."""
    d0 = simulate.Design()
    width = dataclasses.replace(d0, widths=(32.0, 56.0, 90.0, 160.0, 288.0, 512.0), depths=(2,) * 6)
    plan = [  # name, family, design, alpha, config
        ("digits_budget", "budget", d0, 1.0, _config("digits_embedded")),
        ("digits_width", "width", width, 1.0, _config("digits_embedded")),
        ("mnist7_budget", "budget", d0, 0.0, _config("mnist_embedded", pool=4)),
        ("mnist7_wrn", "budget", d0, 0.0, _config("mnist_embedded", pool=4, model="wrn")),
        # A replicate alone adds no second family: still no two-factor fit for mnist7.
        ("mnist7_budget_rep", "budget", d0, 0.0, _config("mnist_embedded", pool=4)),
        # Another protocol on the second data set: compared with that data set's plain SGD.
        ("mnist7_momentum", "budget", d0, 0.0, _config("mnist_embedded", pool=4)),
    ]
    entries, studies, configs = [], {}, {}
    for k, (name, family, design, alpha, config) in enumerate(plan):
        rep = "mnist7_budget" if name.endswith("_rep") else None
        protocol = "momentum 0.9" if "momentum" in name else "plain SGD"
        entries.append(suite_runner.Entry(name, "configs/mlp.py:local", protocol, family, rep))
        rng = np.random.default_rng(20 + k)
        truth = simulate.Truth(alpha=alpha)
        studies[name] = simulate.simulate_study(rng, design, truth)
        configs[name] = config
        os.makedirs(tmp_path / name)
    wd.write_json(
        str(tmp_path / suite_runner.SUITE_FILE),
        {"suite": "s", "entries": [dataclasses.asdict(e) for e in entries], "wall_s": {}},
    )

    def read(folder):
        name = os.path.basename(folder)
        return configs[name], studies[name], 0

    text, rows = answer.render(str(tmp_path), read)
    by = {r["study"]: r for r in rows}
    assert by["digits_budget"]["data"] == "digits_embedded"
    assert by["mnist7_wrn"]["data"] == "mnist_embedded 7x7"
    assert "| mnist7_budget | mnist_embedded 7x7 | plain SGD | budget |" in text
    fits = [ln for ln in text.splitlines() if ln.startswith("- **plain SGD**")]
    # Only the first data set has a budget and a width family: one fit, named by its data set.
    assert len(fits) == 1 and "digits_embedded, mlp" in fits[0]
    assert "mnist7" not in fits[0]
    compared = [ln for ln in text.splitlines() if " minus digits_budget " in ln]
    assert [ln.split(" (")[0] for ln in compared] == ["- mnist7_budget", "- mnist7_wrn"]
    # The momentum study is compared with plain SGD on its own data set: one thing changed.
    momentum = [ln for ln in text.splitlines() if ln.startswith("- mnist7_momentum (")]
    assert len(momentum) == 1
    head = "- mnist7_momentum (momentum 0.9) minus mnist7_budget (plain SGD)"
    assert momentum[0].startswith(head)
    assert "(plain SGD; mlp, mnist_embedded 7x7)" in compared[0]
    assert "(plain SGD; wrn, mnist_embedded 7x7)" in compared[1]
    assert re.search(r"B_x slope [+-]\d\.\d\d \(", compared[0])


def test_the_data_sets_suite_names_real_configs_of_both_architectures():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    entries = suite_runner.load(os.path.join(repo, "configs", "answer.py:data_sets"))
    assert [e.config for e in entries] == [
        "configs/mlp.py:local",
        "configs/mlp.py:mnist7",
        "configs/mlp.py:fashion7",
        "configs/mlp.py:fashion7_replicate",
        "configs/mlp.py:fashion7_width",
        "configs/mlp.py:fashion7_depth",
        "configs/mlp.py:fashion7_momentum",
        "configs/wrn.py:mnist7",
        "configs/wrn.py:fashion7",
        "configs/wrn.py:fashion7_replicate",
    ]
    assert {e.protocol for e in entries} == {"plain SGD", "momentum 0.9"}
    assert [e.replicate_of for e in entries if e.replicate_of] == ["fashion7_mlp", "fashion7_wrn"]
    pair = suite_runner.load(os.path.join(repo, "configs", "answer.py:wrn_fashion7"))
    assert [(e.name, e.replicate_of) for e in pair] == [
        ("fashion7_wrn", ""),
        ("fashion7_wrn_replicate", "fashion7_wrn"),
    ]
