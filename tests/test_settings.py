"""Issue #12: every bad setting or flag gets one line that names it, exit 2, no traceback."""

import json

import pytest

from dlperf.cli import main

TRAIN = ["train", "--recipe", "tiny", "--no-progress"]


def _refused(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("setting, says", [
    ("log_every=0", "log_every must be at least 1"),
    ("eval_every=0", "eval_every must be at least 1"),
    ("image_size=0", "image_size must be in 8..4096"),
    ("seed=-1", "seed must be in 0..4294967295"),
    ("lr_per_256=inf", "lr_per_256 must be a finite number"),
    ("warmup_epochs=nan", "warmup_epochs must be a finite number"),
    ("momentum=5", "momentum must be in [0, 1)"),
    ("weight_decay=-1", "weight_decay must be >= 0"),
    ("keep_last=-1", "keep_last must be at least 1"),
    ("checkpoint_every=-5", "checkpoint_every must be >= 0"),
    ("max_nonfinite_steps=0", "max_nonfinite_steps must be at least 1"),
    ("batch_size=9223372036854775807", "batch_size must be in 1..16,777,216"),
    ("num_classes=1", "num_classes must be at least 2"),
    ("data=", "data must name a folder"),
    ("out_dir=", "out_dir must name a folder"),
    ("prefetch=0", "prefetch must be at least 1"),
    ("target_accuracy=2", "target_accuracy must be in (0, 1]"),
])
def test_bad_train_settings(setting, says, capsys):
    data = [] if setting.startswith("data=") else ["data=synthetic"]
    assert says in _refused(TRAIN + data + [setting], capsys)


def test_steps_per_epoch_with_real_data_is_refused_not_ignored(tmp_path, capsys):
    err = _refused(TRAIN + [f"data={tmp_path}", "steps_per_epoch=5"], capsys)
    assert "steps_per_epoch applies to data=synthetic only" in err


@pytest.mark.parametrize("content, says", [
    (b"recipe = 3\n", "give a recipe name in quotes"),
    (b"\xff\xfe\x00epochs = 2\n", "not UTF-8"),
    (b"epochs = \n", "invalid TOML"),
    (b'recipe = "tiny"\nbogus = 1\n', "unknown setting 'bogus'"),
])
def test_bad_config_files(tmp_path, content, says, capsys):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    assert says in _refused(["train", "--config", str(path)], capsys)


@pytest.mark.parametrize("argv, says", [
    (["analyze", "resnet18", "--batch-size", "9223372036854775807"], "at most 16,777,216"),
    (["analyze", "resnet18", "--input-shape", ""], "--input-shape ''"),
    (["analyze", "resnet18", "--input-shape", "3,,224"], "--input-shape '3,,224'"),
    (["analyze", "resnet18", "--json", "{tmp}"], "is a folder"),
    (["analyze", "resnet18", "--html", "{tmp}/missing/r.html"], "does not exist"),
    (["probe", "--quick", "--out", "{tmp}/missing/p.json"], "does not exist"),
    (["data", "prepare", "{tmp}", "{tmp}/out", "--shard-size", "1e400GB"], "below 1 PB"),
    (["data", "toy", "{tmp}/a-file/sub"], "cannot write there"),
])
def test_bad_flags(tmp_path, argv, says, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert says in _refused(argv, capsys)


@pytest.mark.parametrize("change, says", [
    ({"peak": {"fp16": 1e14}}, "no 'fp32' entry"),
    ({"tc_alignment_bytes": 0}, "tc_alignment_bytes must be a number >= 1"),
    ({"tc_alignment_bytes": 12}, "must be a power of two"),
    ({"launch_overhead_s": -1}, "launch_overhead_s must be a number >= 0"),
    ({"sm_count": 1.5}, "sm_count must be a whole number"),
])
def test_bad_device_files(tmp_path, change, says, capsys):
    spec = {"name": "mine", "sm_count": 10, "mem_bandwidth": 1e12,
            "peak": {"fp32": 1e13, "fp16": 1e14}, **change}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec))
    assert says in _refused(["analyze", "resnet18", "--device", str(path)], capsys)


def test_a_good_device_file_still_works(tmp_path, capsys):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "sm_count": 10, "mem_bandwidth": 1e12,
                                "peak": {"fp32": 1e13, "fp16": 1e14}, "launch_overhead_s": 0}))
    assert main(["analyze", "resnet18", "--batch-size", "2", "--dtype", "fp16",
                 "--device", str(path)]) == 0
    assert "Predicted step" in capsys.readouterr().out


DATA_DEPENDENT = '''
import torch
from torch import nn

class Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y[torch.nonzero(y > 0)[:, 0]]

class Item(Nonzero):
    def forward(self, x):
        y = self.fc(x)
        return y * 2 if y.sum().item() > 0 else y

def nonzero():
    return Nonzero()

def item():
    return Item()
'''


@pytest.mark.parametrize("factory, op", [("nonzero", "torch.nonzero"), ("item", "Tensor.item()")])
def test_data_dependent_ops_are_named_not_blamed_on_the_input(tmp_path, factory, op, capsys):
    path = tmp_path / "dd.py"
    path.write_text(DATA_DEPENDENT)
    err = _refused(["analyze", f"{path}:{factory}", "--input-shape", "8", "--batch-size", "4"],
                   capsys)
    assert f"calls {op}" in err and "--input-shape" not in err and "shape-static" in err


def test_every_option_says_what_it_does():
    import argparse

    from dlperf.cli import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif action.option_strings and action.dest != "help":
                yield " ".join(path), action

    missing = [f"{where} {a.option_strings[0]}" for where, a in walk(build_parser(), ["dlperf"])
               if not a.help and not isinstance(a, argparse._VersionAction)]
    assert not missing, missing


def test_json_path_means_the_same_in_every_command(tmp_path, capsys):
    """`--json PATH` writes the command's result wherever a command has one."""
    from dlperf.data.toy import make_toy

    from dlperf.cli import build_parser

    for argv in (["devices"], ["data", "prepare", "s", "d"], ["data", "verify", "d"],
                 ["data", "inspect", "s"], ["train"], ["analyze", "resnet18"]):
        args = build_parser().parse_args(argv + ["--json", "x.json"])
        assert args.json == "x.json", argv
    assert main(["devices", "--json", str(tmp_path / "devices.json")]) == 0
    assert {d["name"] for d in json.loads((tmp_path / "devices.json").read_text())} >= {
        "h100-sxm", "h200"}
    assert main(["devices", "--json"]) == 0  # no PATH: printed, as before
    assert json.loads(capsys.readouterr().out.split("Wrote")[-1].split("\n", 1)[1])
    toy = make_toy(tmp_path / "toy", per_class=3)
    assert main(["data", "prepare", str(toy), str(tmp_path / "shards"), "--json",
                 str(tmp_path / "prepare.json")]) == 0
    assert json.loads((tmp_path / "prepare.json").read_text())["samples"] == 12
    assert main(["data", "verify", str(tmp_path / "shards"), "--json",
                 str(tmp_path / "verify.json")]) == 0
    assert json.loads((tmp_path / "verify.json").read_text())["problems"] == []
    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", "--no-progress", "--no-mfu", f"data={toy}",
                 "val_data=none", f"out_dir={out}", "epochs=1", "batch_size=4", "threads=2",
                 "--json", str(tmp_path / "train.json")]) == 0
    assert json.loads((tmp_path / "train.json").read_text())["steps"] == 3
    capsys.readouterr()
    assert "is a folder" in _refused(["data", "verify", str(tmp_path / "shards"), "--json",
                                      str(tmp_path)], capsys)


def test_an_unknown_flag_is_named_alone_and_overrides_are_not_blamed(capsys):
    err = _refused(TRAIN + ["epochs=2", "--bogus", "data=synthetic"], capsys)
    assert "--bogus" in err and "epochs=2" not in err and "data=synthetic" not in err


def test_prepare_into_an_unwritable_place_is_one_line(tmp_path, capsys):
    from dlperf.data.toy import make_toy

    toy = make_toy(tmp_path / "toy", per_class=2)
    (tmp_path / "a-file").write_text("not a folder")
    err = _refused(["data", "prepare", str(toy), str(tmp_path / "a-file" / "shards")], capsys)
    assert "cannot write" in err
