"""Issue #12: no run trains on a lie, no run folder is shared, no checkpoint is lost or mixed."""

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dlperf.cli import main
from dlperf.errors import DlperfError
from dlperf.train import checkpoint as ckpt
from dlperf.train.loop import train
from dlperf.train.recipes import apply_overrides, resume_differences, tiny
from dlperf.train.runlock import LOCK_NAME, RunLock
from conftest import tiny_config, toy_split


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return toy_split(tmp_path_factory, per_class=8, val_per_class=4)


def _cfg(toy, out, **kw):
    return tiny_config(toy, out, **{"epochs": 1, "batch_size": 8, **kw})


def _run(cfg, resume="auto", **kw):
    return train(cfg, resume=resume, progress=False, mfu=False, **kw)


def _snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes (what "nothing changed on disk" compares)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def _flip_a_byte(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_an_explicit_checkpoint_path_is_checked_against_its_manifest(toy, tmp_path):
    out = tmp_path / "a"
    _run(_cfg(toy, out), resume=None)
    newest = ckpt.complete(out / "checkpoints")[-1]
    _flip_a_byte(newest.path)
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        _run(_cfg(toy, tmp_path / "b"), resume=str(newest.path))
    loose = tmp_path / "loose.pt"  # a copy without its manifest cannot be checked
    loose.write_bytes(ckpt.complete(out / "checkpoints")[0].path.read_bytes())
    with pytest.raises(ckpt.CheckpointError, match="no manifest"):
        _run(_cfg(toy, tmp_path / "c"), resume=str(loose))
    assert not (tmp_path / "b" / "config.json").exists()  # refused before writing anything


def test_changed_settings_are_refused_before_anything_changes_on_disk(toy, tmp_path):
    out = tmp_path / "run"
    _run(_cfg(toy, out, lr_per_256=0.8), resume=None)
    before = _snapshot(out)
    for change in ({"lr_per_256": 0.4}, {"model": "resnet18"}, {"num_classes": 10},
                   {"optimizer": "lars"}, {"dtype": "bf16"}):
        with pytest.raises(DlperfError, match=f"settings differ.*{list(change)[0]}") as exc:
            _run(_cfg(toy, out, **{"lr_per_256": 0.8, **change}))
        assert "\n" not in str(exc.value) and "nothing was changed" in str(exc.value)
        assert _snapshot(out) == before  # config.json, summary.json, logs, checkpoints


def test_rerunning_a_finished_run_trains_nothing_and_rewrites_nothing(toy, tmp_path, capsys):
    out = tmp_path / "done"
    first = _run(_cfg(toy, out), resume=None)
    before = _snapshot(out)
    again = _run(_cfg(toy, out, log_every=3))  # a setting a resume may change
    assert again["already_finished"] and again["steps"] == first["steps"]
    assert _snapshot(out) == before  # summary.json and config.json as they were
    # more epochs: the same command trains on, and says what that does to the schedule
    more = train(_cfg(toy, out, epochs=2), resume="auto", progress=False, mfu=False)
    assert more["steps"] == 2 * first["steps"] and "already_finished" not in more
    assert "epochs 1 -> 2 on resume" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["config"]["epochs"] == 2


def test_resume_differences_split_refused_from_accepted():
    base = tiny()
    saved = base.to_dict()
    now = apply_overrides(base, {"epochs": 9, "log_every": 1, "lr_per_256": 0.3})
    refused, accepted = resume_differences(saved, now)
    assert refused == [("lr_per_256", base.lr_per_256, 0.3)]
    assert {k for k, _, _ in accepted} == {"epochs", "log_every"}
    # a setting an older checkpoint does not record is not compared
    del saved["lr_per_256"]
    assert resume_differences(saved, now)[0] == []


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(toy, tmp_path):
    out = tmp_path / "m"
    _run(_cfg(toy, out), resume=None)
    state, info = ckpt.load_latest(out / "checkpoints")
    del state["config"]  # as an older dlperf wrote it: nothing to compare settings with
    state["model"] = {k: v[..., :1] if v.dim() else v for k, v in state["model"].items()}
    ckpt.save(tmp_path / "other", state, info.step + 1, info.epoch)
    path = ckpt.complete(tmp_path / "other")[-1].path
    with pytest.raises(DlperfError, match="does not fit this run's model") as exc:
        _run(_cfg(toy, tmp_path / "n"), resume=str(path))
    assert "\n" not in str(exc.value)


def test_a_second_run_on_the_same_folder_is_refused(toy, tmp_path):
    out = tmp_path / "busy"
    with RunLock(out):
        with pytest.raises(DlperfError, match="in use by another dlperf train .*pid "
                                              f"{os.getpid()}"):
            _run(_cfg(toy, out), resume=None)
    assert not (out / "checkpoints").exists()
    _run(_cfg(toy, out), resume=None)  # released: the folder is free again


HOLDER = """
import sys, time
from dlperf.train.runlock import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_killed_run_does_not_leave_the_folder_locked(tmp_path):
    out = tmp_path / "crashed"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(DlperfError, match=f"pid {proc.pid}"):
            with RunLock(out):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with RunLock(out):  # the kernel dropped the dead holder's lock
        assert (out / LOCK_NAME).exists()


def test_a_corrupt_newest_checkpoint_is_said_moved_aside_and_not_kept(toy, tmp_path, capsys):
    out = tmp_path / "k"  # 32 images, batch 8: 4 steps per epoch, 8 in all
    with pytest.raises(Exception, match="stopped at step 5"):
        _run(_cfg(toy, out, epochs=2, checkpoint_every=1, keep_last=2), resume=None,
             stop_at_step=5)
    infos = ckpt.complete(out / "checkpoints")
    assert [c.step for c in infos] == [4, 5]
    _flip_a_byte(infos[-1].path)
    _run(_cfg(toy, out, epochs=2, checkpoint_every=0, keep_last=2))  # next save: step 8
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "checksum mismatch" in err and "moved aside" in err
    assert (out / "checkpoints" / "step-00000005.pt.corrupt").exists()
    # resumed from step 4, which stays among the last two: the corrupt step 5 no longer
    # counts as complete, so it did not push a good checkpoint out of keep_last
    assert [c.step for c in ckpt.complete(out / "checkpoints")] == [4, 8]
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert any(x["kind"] == "warning" and "checksum" in x["message"] for x in log)
    assert any(x["kind"] == "resume" and x["step"] == 4 for x in log)


def test_disk_full_while_checkpointing_stops_in_one_line_and_keeps_the_older(toy, tmp_path,
                                                                           monkeypatch):
    out = tmp_path / "full"
    cfg = _cfg(toy, out, epochs=2, checkpoint_every=3)  # saves at steps 3, 4 (epoch), 6, 8
    real = ckpt.save
    calls = {"n": 0}

    def save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save", save)
    with pytest.raises(DlperfError, match="No space left on device.*intact") as exc:
        _run(cfg, resume=None)
    assert "\n" not in str(exc.value)
    assert [c.step for c in ckpt.complete(out / "checkpoints")] == [3, 4]
    monkeypatch.setattr(ckpt, "save", real)
    assert _run(cfg)["steps"] == 8  # the same command resumes from the newest


def test_cli_refusals_name_the_flag_that_exists(toy, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["train", "--recipe", "tiny", "--no-progress", f"data={toy[0]}", "val_data=none",
            f"out_dir={out}", "epochs=1", "batch_size=8", "threads=2"]
    assert main(args + ["--resume", "never"]) == 0
    capsys.readouterr()
    assert main(args + ["--resume", "never"]) == 2
    err = capsys.readouterr().err
    assert "--resume auto" in err and "resume=auto" not in err
    assert main(args + ["lr_per_256=0.5"]) == 2
    assert "lr_per_256" in capsys.readouterr().err
    assert main(args) == 0 and "already finished" in capsys.readouterr().out


def test_the_cpu_ceiling_is_probed_once_per_machine(tmp_path, monkeypatch):
    from dlperf.hardware import probe as P

    monkeypatch.setenv("DLPERF_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = P.probe

    def counting(cfg, progress=None):
        calls.append(cfg)
        return real(cfg, progress)

    monkeypatch.setattr(P, "probe", counting)
    first, where = P.cached_cpu_probe()
    again, where_again = P.cached_cpu_probe()
    assert len(calls) == 1 and again.peak == first.peak and where_again == where
    assert list((tmp_path / "cache").glob("cpu-probe-*.json"))
    # another environment (here: another thread count) is probed afresh
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        P.cached_cpu_probe()
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 2


def test_a_run_that_outpaces_its_cached_ceiling_probes_again_and_never_reports_mfu_above_1(
        tmp_path, monkeypatch):
    # a cache written by a probe that ran beside other work holds too low a ceiling; a run
    # doing more than it re-probes, keeps each unit's larger figure, and only then divides
    import dataclasses

    import torch

    from dlperf.hardware import probe as P
    from dlperf.train.metrics import utilisation

    monkeypatch.setenv("DLPERF_CACHE_DIR", str(tmp_path / "cache"))

    def fake(cfg, progress=None):  # what the probe measures now: ``fresh``
        base = P.DeviceSpec(name="cpu", display_name="cpu", sm_count=2, mem_bandwidth=30e9,
                            measured=True)
        return dataclasses.replace(base, peak=dict(fresh)), []

    monkeypatch.setattr(P, "probe", fake)
    fresh = {"fp32": 10e9, "bf16": 400e9}  # the loaded probe: fp32 low, bf16 high
    P.cached_cpu_probe()
    fresh = {"fp32": 100e9, "bf16": 150e9}
    cpu = torch.device("cpu")
    # under the cached ceiling: no probe, the cached figure
    assert utilisation(5e9, cpu, "fp32") == {"peak_flops": 10e9, "peak_source":
                                             "this CPU, probed (fp32)", "mfu": 0.5}
    # above it: probed again; fp32 takes the new 100, bf16 keeps the cached 400 (the larger)
    use = utilisation(40e9, cpu, "fp32")
    assert use["peak_flops"] == 100e9 and use["mfu"] == pytest.approx(0.4)
    spec, _ = P.cached_cpu_probe()
    assert spec.peak == {"fp32": 100e9, "bf16": 400e9}
    # a run above even the new ceiling: no utilisation, and why
    use = utilisation(300e9, cpu, "fp32")
    assert use["mfu"] is None and "300 GFLOP/s exceed the measured ceiling (100)" in use[
        "mfu_note"]


def test_summary_is_on_disk_before_the_mfu_ceiling_is_looked_up(toy, tmp_path, monkeypatch):
    from dlperf.train import metrics

    out = tmp_path / "s"
    seen = {}

    def ceiling(device, dtype, spec_and_source=None):
        seen["summary"] = json.loads((out / "summary.json").read_text())
        return 1e12, "test ceiling"

    monkeypatch.setattr(metrics, "peak_flops", ceiling)
    summary = train(_cfg(toy, out), resume=None, progress=False, mfu=True)
    assert seen["summary"]["steps"] == summary["steps"] and "mfu" not in seen["summary"]
    assert json.loads((out / "summary.json").read_text())["mfu"] == summary["mfu"] > 0


def test_epochs_csv_after_a_mid_epoch_resume_averages_the_whole_epoch(toy, tmp_path):
    rows = {}
    for name, stop in (("whole", None), ("resumed", 2)):
        cfg = _cfg(toy, tmp_path / name, epochs=2, deterministic=True)
        if stop:
            with pytest.raises(Exception, match="stopped at step 2"):
                _run(cfg, resume=None, stop_at_step=stop)  # half of epoch 0
            _run(cfg)
        else:
            _run(cfg, resume=None)
        lines = (tmp_path / name / "epochs.csv").read_text().splitlines()
        header = lines[0].split(",")
        rows[name] = [dict(zip(header, line.split(","))) for line in lines[1:]]
    assert [r["epoch"] for r in rows["resumed"]] == ["0", "1"]
    for whole, resumed in zip(rows["whole"], rows["resumed"]):
        assert float(resumed["loss"]) == pytest.approx(float(whole["loss"]), rel=1e-6)
