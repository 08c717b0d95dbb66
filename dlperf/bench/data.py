"""`dlperf bench data`: the input pipeline against torchvision's and DALI's, side by side.

Every pipeline runs the same training transform (random-resized-crop to 224 + flip) over the same
JPEG corpus, in the same process and run; each pipeline's rate is the median over its timed
blocks (whole epochs lasting >= MIN_BLOCK_S), each after an untimed settle epoch (see ``run``
for how they are interleaved).

(a) torchvision ImageFolder + PIL + RandomResizedCrop + flip + ToTensor + Normalize, DataLoader
    with ``workers`` worker processes (the common baseline);
(b) NVIDIA DALI's CPU pipeline (decoders.image_random_crop + resize + flip, uint8), if installed;
(c) dlperf's CPU path at 1 and ``threads`` threads, uint8 NHWC batches;
(d) dlperf on shards re-encoded by ``dlperf data prepare --max-side 256``;
(e) DALI and dlperf again on the same corpus rewritten losslessly with restart markers (what
    ``dlperf data prepare`` stores by default: same pixels, and dlperf's ROI decoder reads
    only the restart intervals under each crop), as a folder so both read the very same files;
(f) dlperf on the shards ``dlperf data prepare`` writes by default (those files, in tar shards
    read by offset: the path the README recommends);
(g) FFCV, if installed: its own ``.beton`` of the corpus (JPEG q90 at the original sizes, as its
    ImageNet example writes, and again at max side ``max_side``) read by its
    RandomResizedCropRGBImageDecoder + flip, uint8 NHWC, ``threads`` threads.

One module of ~420 lines: every pipeline is timed by the same interleaved rounds
(``measure_interleaved``), so a slow spell of the machine hits them all alike.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dlperf.errors import DlperfError

# Throughputs measured on this kind of 2-core machine in an earlier project run (the anchors the
# issue-#3 goals were set against), used for a ratio only when DALI is not installed here.
NOTES_ANCHORS = {"torchvision_2_workers": 492.0, "dali_cpu_2_threads": 921.0}
GOALS = {"dlperf_cpu_img_s": 1850.0, "dlperf_shards256_img_s": 5000.0}


@dataclass(frozen=True)
class DataBenchConfig:
    data: str
    batch_size: int = 64
    threads: int = 2
    workers: int = 2
    rounds: int = 7
    size: int = 224
    max_side: int = 256


def _torchvision(cfg: DataBenchConfig):
    import torch
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(cfg.size), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(cfg.data, tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, shuffle=True,
                                         num_workers=cfg.workers, persistent_workers=cfg.workers > 0)
    return loader, len(ds)


def _dali(cfg: DataBenchConfig, root: str):
    try:
        from nvidia.dali import fn, pipeline_def, types  # noqa: F401
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError:
        return None, 0
    files = sorted(str(p) for p in Path(root).rglob("*") if p.is_file())

    @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.threads, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=cfg.size, resize_y=cfg.size)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, labels

    p = pipe()
    p.build()
    return DALIGenericIterator([p], ["images", "labels"], reader_name="reader",
                               auto_reset=True), len(files)


def _ffcv(cfg: DataBenchConfig, root: str, beton: Path, max_side: int | None):
    """FFCV's loader on a .beton written from ``root`` by FFCV's own writer; (None, 0) when
    ffcv is not installed. FFCV re-encodes every image (q90, as its ImageNet example), so it
    reads smaller files than the corpus: a gift to it, noted in the results."""
    try:
        from ffcv.fields import IntField, RGBImageField
        from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor
        from ffcv.writer import DatasetWriter
    except ImportError:
        return None, 0
    from dlperf.data.sources import FileSource

    src = FileSource.from_folder(root)
    ds = _PilDataset(src)
    field = RGBImageField(write_mode="jpg", max_resolution=max_side, jpeg_quality=90)
    DatasetWriter(str(beton), {"image": field, "label": IntField()},
                  num_workers=cfg.threads).from_indexed_dataset(ds)
    loader = Loader(str(beton), batch_size=cfg.batch_size, num_workers=cfg.threads,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((cfg.size, cfg.size)),
                                  RandomHorizontalFlip(), ToTensor()],
                        "label": [IntDecoder(), ToTensor(), Squeeze()]})
    return loader, len(ds)


def _beton_payload_mb(beton: Path) -> float:
    """Bytes of the samples in a .beton (the file itself is padded to FFCV's 8 MB pages)."""
    from ffcv.reader import Reader

    return float(Reader(str(beton)).alloc_table["size"].sum()) / 1e6


class _PilDataset:
    """(RGB PIL image, label) by index: what FFCV's DatasetWriter takes."""

    def __init__(self, source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        import io

        from PIL import Image

        with Image.open(io.BytesIO(self.source.read(i))) as im:
            return im.convert("RGB"), int(self.source.label(i))


def _dlperf(cfg: DataBenchConfig, data, threads: int, limits=None):
    from dlperf.data.decode import DecodeLimits
    from dlperf.data.loader import Loader, LoaderConfig
    from dlperf.data.sources import open_source

    source = open_source(data)
    return Loader(source, LoaderConfig(batch_size=cfg.batch_size, threads=threads, size=cfg.size,
                                       drop_last=False, pin_memory=False,
                                       limits=limits or DecodeLimits())), len(source)


def lossless_copy(src: str, dst: Path) -> Path:
    """The corpus folder with every JPEG rewritten by ``lossless_restart`` (same pixels), the
    other images copied as they are and other files (a README) left out, as the folder
    readers leave them out. A damaged JPEG stops the benchmark with its name: every pipeline
    must read the same images, and some of them (torchvision's) have no way to skip one."""
    from dlperf.data.decode import BadImage, lossless_restart
    from dlperf.data.sources import IMAGE_EXTENSIONS

    for path in sorted(Path(src).rglob("*")):
        if path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS:
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes()
            try:
                target.write_bytes(lossless_restart(data) if data[:2] == b"\xff\xd8" else data)
            except BadImage as exc:
                raise DlperfError(f"{path}: {exc}; the benchmark times every pipeline on the "
                                  "same images: remove it, or benchmark a `dlperf data "
                                  "prepare` output, which skips such files") from None
    return dst


def repeated_list(corpus: str | Path, times: int, csv_path: str | Path) -> Path:
    """A ``path,label`` list naming every image of ``corpus`` ``times`` times (a longer epoch
    from a small corpus, for fast pipelines whose single epoch would be too short to time)."""
    from dlperf.data.sources import FileSource

    src = FileSource.from_folder(corpus)
    rows = [f"{Path(src.name(i)).resolve()},{src.label(i)}\n" for i in range(len(src))]
    Path(csv_path).write_text("path,label\n" + "".join(rows) * times)
    return Path(csv_path)


def _count(batch) -> int:
    if hasattr(batch, "labels"):  # dlperf Batch
        return len(batch.labels)
    if isinstance(batch[0], dict):  # DALI: [{"images": ..., "labels": ...}]
        return batch[0]["images"].shape[0]
    return len(batch[0])  # torchvision: [images, labels]


def _wait_until_idle(quiet_s: float = 0.05, limit_s: float = 3.0) -> None:
    """Return once this process's threads used under 10% of one core for ``quiet_s``."""
    end = time.perf_counter() + limit_s
    while time.perf_counter() < end:
        cpu = time.process_time()
        time.sleep(quiet_s)
        if time.process_time() - cpu < 0.1 * quiet_s:
            return


def epoch_rate(loader, n: int, epochs: int = 1) -> float:
    """Images per second over ``epochs`` consecutive epochs (one timed block)."""
    t0 = time.perf_counter()
    seen = sum(_count(batch) for _ in range(epochs) for batch in loader)
    dt = time.perf_counter() - t0
    if seen == 0:
        raise DlperfError("a pipeline produced no samples")
    return seen / dt


MIN_BLOCK_S = 0.4  # a timed block lasts at least this long (a 320-image epoch at 5,000 img/s
#                    is 64 ms, where the first batch's latency and timer noise weigh too much)


def measure_interleaved(pipelines: dict, rounds: int, progress=None
                        ) -> tuple[dict[str, list[float]], dict[str, int]]:
    """img/s of every (loader, samples per epoch) in ``pipelines``, one timed block per round,
    and the epochs per block of each."""
    rates: dict[str, list[float]] = {k: [] for k in pipelines}
    epochs: dict[str, int] = {}  # epochs per timed block, per pipeline
    # Every round runs each pipeline for an untimed settle epoch, then a timed block, then waits
    # until the process is idle. DALI and dlperf keep decoding the next epoch's first batches in
    # the background after an epoch ends (steady state when streaming); on this small corpus that
    # is up to half an epoch of work, which would otherwise land on whichever pipeline runs
    # next. The settle epoch makes the timed one start with the pipeline's own steady-state head
    # start. Switching every round spreads this machine's slow and fast phases evenly over the
    # pipelines, which longer blocks per pipeline did not. A fast pipeline's block is several
    # epochs (MIN_BLOCK_S), streaming from one into the next as in training.
    names = list(pipelines)
    for name in names:  # warm-up: workers started, FFCV's JIT compiled, files in the page cache
        epoch_rate(*pipelines[name])
        _wait_until_idle()
    for r in range(rounds):
        # rotate the order every round: each pipeline runs in each position equally often
        # (a fixed order put the same neighbour before each one, worth a few percent here)
        for name in names[r % len(names):] + names[:r % len(names)]:
            loader, n = pipelines[name]
            settle = epoch_rate(loader, n)
            # as many whole epochs as fill MIN_BLOCK_S, from the settle epoch's rate (fixed
            # after the first round, so every timed block of a pipeline does the same work)
            k = epochs.setdefault(name, max(1, math.ceil(MIN_BLOCK_S * settle / n)))
            rates[name].append(epoch_rate(loader, n, k))
            _wait_until_idle()
            if progress:
                progress()
    return rates, epochs


def _ratios_and_goals(med: dict, cfg: DataBenchConfig) -> dict:
    """The comparisons the benchmark is read for, from the median img/s of each pipeline."""
    main = med[f"dlperf_{cfg.threads}_threads"]
    shards = med[f"dlperf_shards{cfg.max_side}_{cfg.threads}_threads"]
    dali_rate = med.get("dali_cpu")
    restart_rate = med[f"dlperf_restart_markers_{cfg.threads}_threads"]
    dali_restart = med.get("dali_cpu_restart_markers")
    prepared = med[f"dlperf_prepared_shards_{cfg.threads}_threads"]
    ffcv_rate, ffcv_small = med.get("ffcv"), med.get(f"ffcv_max{cfg.max_side}")
    return {
        "ratios": {
            "dlperf_vs_torchvision": main / med["torchvision"],
            "dlperf_vs_dali_measured": main / dali_rate if dali_rate else None,
            "dlperf_vs_dali_notes_anchor": main / NOTES_ANCHORS["dali_cpu_2_threads"],
            "thread_scaling": main / med["dlperf_1_thread"],
            "shards_vs_torchvision": shards / med["torchvision"],
            "restart_markers_vs_raw_folder": restart_rate / main,
            "restart_markers_vs_dali_same_files": (restart_rate / dali_restart
                                                   if dali_restart else None),
            "restart_markers_vs_dali_raw_folder": restart_rate / dali_rate if dali_rate else None,
            "prepared_shards_vs_dali_raw_folder": prepared / dali_rate if dali_rate else None,
            "prepared_shards_vs_torchvision": prepared / med["torchvision"],
            "dlperf_vs_ffcv": main / ffcv_rate if ffcv_rate else None,
            "prepared_shards_vs_ffcv": prepared / ffcv_rate if ffcv_rate else None,
            "shards_vs_ffcv_same_max_side": shards / ffcv_small if ffcv_small else None,
        },
        "goals": {"dlperf_cpu_img_s": {"goal": GOALS["dlperf_cpu_img_s"], "measured": main,
                                       "met": main >= GOALS["dlperf_cpu_img_s"]},
                  "dlperf_prepared_shards_img_s": {"goal": GOALS["dlperf_cpu_img_s"],
                                                   "measured": prepared,
                                                   "met": prepared >= GOALS["dlperf_cpu_img_s"]},
                  "dlperf_shards256_img_s": {"goal": GOALS["dlperf_shards256_img_s"],
                                             "measured": shards,
                                             "met": shards >= GOALS["dlperf_shards256_img_s"]}}
    }


def run(cfg: DataBenchConfig, progress=None) -> dict:
    if not Path(cfg.data).is_dir():
        raise DlperfError(f"{cfg.data}: corpus folder not found (an ImageNet-layout folder)")
    from dlperf.data.prepare import PrepareConfig, prepare

    tmp = tempfile.TemporaryDirectory(prefix="dlperf-bench-")
    t0 = time.perf_counter()
    prepare(cfg.data, Path(tmp.name) / "shards", PrepareConfig(max_side=cfg.max_side))
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepare(cfg.data, Path(tmp.name) / "prepared", PrepareConfig())  # lossless, the default
    prepare_lossless_s = time.perf_counter() - t0
    from dlperf.data.inspect import inspect
    from dlperf.data.sources import open_source

    decode_paths = {name: {k: v for k, v in inspect(open_source(root))["paths"].items() if v}
                    for name, root in (("raw", cfg.data), ("prepared", Path(tmp.name) / "prepared"))}
    restart = str(lossless_copy(cfg.data, Path(tmp.name) / "restart"))
    sizes_mb = {name: sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file()) / 1e6
                for name, root in (("corpus", cfg.data), ("prepared", Path(tmp.name) / "prepared"),
                                   (f"shards{cfg.max_side}", Path(tmp.name) / "shards"))}
    pipelines = {"torchvision": _torchvision(cfg)}
    dali = _dali(cfg, cfg.data)
    if dali[0] is not None:
        pipelines["dali_cpu"] = dali
    pipelines["dlperf_1_thread"] = _dlperf(cfg, cfg.data, 1)
    pipelines[f"dlperf_{cfg.threads}_threads"] = _dlperf(cfg, cfg.data, cfg.threads)
    pipelines[f"dlperf_shards{cfg.max_side}_{cfg.threads}_threads"] = _dlperf(
        cfg, Path(tmp.name) / "shards", cfg.threads)
    dali = _dali(cfg, restart)
    if dali[0] is not None:
        pipelines["dali_cpu_restart_markers"] = dali
    pipelines[f"dlperf_restart_markers_{cfg.threads}_threads"] = _dlperf(cfg, restart, cfg.threads)
    pipelines[f"dlperf_prepared_shards_{cfg.threads}_threads"] = _dlperf(
        cfg, Path(tmp.name) / "prepared", cfg.threads)
    for name, side in (("ffcv", None), (f"ffcv_max{cfg.max_side}", cfg.max_side)):
        beton = Path(tmp.name) / f"{name}.beton"
        ffcv = _ffcv(cfg, cfg.data, beton, side)
        if ffcv[0] is not None:
            pipelines[name] = ffcv
            sizes_mb[name] = _beton_payload_mb(beton)
    rates, epochs = measure_interleaved(pipelines, cfg.rounds, progress)
    for loader, _ in pipelines.values():
        if hasattr(loader, "close"):
            loader.close()
    tmp.cleanup()
    med = {k: statistics.median(v) for k, v in rates.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "img_per_s": med, "img_per_s_all_rounds": rates,
        "img_per_s_per_core": {k: v / (1 if "1_thread" in k else cores) for k, v in med.items()},
        "cores": cores, "prepare_seconds": prepare_s, "prepare_lossless_seconds": prepare_lossless_s,
        **_ratios_and_goals(med, cfg),
        "decode_paths": decode_paths,  # `dlperf data inspect` of the raw and prepared corpus
        "anchors_from_notes": NOTES_ANCHORS, "dali_installed": "dali_cpu" in med,
        "ffcv_installed": "ffcv" in med, "stored_mb": sizes_mb,
        "epochs_per_timed_block": epochs, "min_block_seconds": MIN_BLOCK_S,
        "config": asdict(cfg),
    }


# The ladder: dlperf's CPU path built up one speed-up at a time, each rung the one before plus
# one change (every benchmark here is a baseline plus one change), on the same corpus and crops.
LADDER = (
    ("full decode, exact IDCT, then crop + resize (1 thread)", "raw",
     dict(fast_idct=False, dct_scaling=False, region=False), 1),
    ("+ fast integer IDCT and plain chroma upsampling", "raw",
     dict(dct_scaling=False, region=False), 1),
    ("+ DCT-scaled decode (1/2, 1/4, 1/8 when the crop allows)", "raw", dict(region=False), 1),
    ("+ region decode (only the crop's rows and columns)", "raw", {}, 1),
    ("+ restart markers (lossless rewrite, as a folder)", "restart", {}, 1),
    ("+ shards written by `dlperf data prepare`", "prepared", {}, 1),
    ("+ {threads} decode threads", "prepared", {}, None),
)


def run_ladder(cfg: DataBenchConfig, progress=None) -> dict:
    """Every LADDER rung measured side by side (measure_interleaved); rate and speed-up of each
    over the rung before it and over the first."""
    if not Path(cfg.data).is_dir():
        raise DlperfError(f"{cfg.data}: corpus folder not found (an ImageNet-layout folder)")
    from dlperf.data.decode import ROI_AVAILABLE, DecodeLimits
    from dlperf.data.prepare import PrepareConfig, prepare

    with tempfile.TemporaryDirectory(prefix="dlperf-ladder-") as tmp:
        roots = {"raw": cfg.data, "restart": str(lossless_copy(cfg.data, Path(tmp) / "restart"))}
        prepare(cfg.data, Path(tmp) / "prepared", PrepareConfig())
        roots["prepared"] = str(Path(tmp) / "prepared")
        ladder = [(name.format(threads=cfg.threads), root, switches, threads or cfg.threads)
                  for name, root, switches, threads in LADDER]
        pipelines = {name: _dlperf(cfg, roots[root], threads, DecodeLimits(**switches))
                     for name, root, switches, threads in ladder}
        rates, epochs = measure_interleaved(pipelines, cfg.rounds, progress)
        for loader, _ in pipelines.values():
            loader.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    rungs, prev = [], None
    for name, root, switches, threads in ladder:
        rate = med[name]
        rungs.append({"rung": name, "data": root, "threads": threads,
                      "decode_switches": {**asdict(DecodeLimits()), **switches},
                      "img_per_s": rate, "all_rounds": rates[name], "epochs_per_block": epochs[name],
                      "vs_previous": rate / prev if prev else 1.0,
                      "vs_baseline": rate / med[ladder[0][0]]})
        prev = rate
    return {"rungs": rungs, "roi_decoder": ROI_AVAILABLE, "min_block_seconds": MIN_BLOCK_S,
            "config": asdict(cfg)}


def plot_ladder(result: dict, path: str | Path) -> Path | None:
    """Bar chart of the ladder: img/s per rung with its gain over the rung before (PNG)."""
    from dlperf.plots import bar_chart

    rungs = result["rungs"]
    labels = [f"{r['img_per_s']:,.0f}" + ("" if r is rungs[0] else f"  x{r['vs_previous']:.2f}")
              for r in rungs]
    return bar_chart(path, [r["rung"] for r in rungs], [r["img_per_s"] for r in rungs], labels,
                     f"images/s (median of {result['config']['rounds']} timed blocks); "
                     "xN: gain over the rung above")


def plot(result: dict, path: str | Path) -> Path | None:
    """Bar chart of img/s per pipeline (PNG), dlperf's in blue, with the goals; None when
    matplotlib is missing."""
    from dlperf.plots import bar_chart

    # grouped by what is read: the JPEG corpus (or FFCV's q90 copy of it), the losslessly
    # rewritten corpus, then the max-side copies
    groups = ("torchvision", "dali_cpu", "ffcv", "dlperf_1_thread", "dlperf_", "dali_cpu_restart",
              "dlperf_restart", "dlperf_prepared", "ffcv_max", "dlperf_shards")

    def group(name: str) -> int:  # the position of the longest matching prefix
        match = max((g for g in groups if name.startswith(g)), key=len, default=None)
        return groups.index(match) if match else len(groups)

    names = sorted(result["img_per_s"], key=group)
    values = [result["img_per_s"][n] for n in names]
    goals = tuple(result["goals"][k]["goal"] for k in ("dlperf_cpu_img_s", "dlperf_shards256_img_s"))
    return bar_chart(path, names, values, [f"{v:,.0f}" for v in values],
                     f"images/s (train transform, {result['cores']} cores, median of "
                     f"{result['config']['rounds']} timed blocks)",
                     colors=["#999999" if not n.startswith("dlperf") else "#1f77b4"
                             for n in names], headroom=1.18, goals=goals)
