"""The host loaders of NVIDIA's DeepLearningExamples ConvNets, timed per core on this machine.

The scale-out table's CPU-loader rows (validation/published_scaling.csv: sources dle-convnets,
dle-efficientnet, nvidia-pytorch-rn50-a100) ran DeepLearningExamples' ``pytorch`` data backend
(image_classification/dataloaders.py, get_pytorch_train_loader): ImageFolder + PIL,
RandomResizedCrop (bilinear for the ResNets, bicubic for EfficientNet), a horizontal flip, for
EfficientNet AutoAugment's ImageNet policy (configs.yml: augmentation autoaugment), then
``fast_collate`` into a uint8 batch (normalisation happens on the GPU). What that costs per host
core decides whether eight GPUs starve; no source publishes it, so it is measured here, each
pipeline as DeepLearningExamples builds it (torchvision's AutoAugment stands in for its
AutoaugmentImageNetPolicy: the same policy of the AutoAugment paper), with torchvision's
float ToTensor + Normalize pipeline of `dlperf bench data` beside them for reference.

Pipelines are interleaved round by round (dlperf.bench.data.measure_interleaved) with one
DataLoader worker per core; the rates per core are the medians / workers. The rows use them as
``decode_img_s_per_core`` with the flag decode-rate-assumed: the DGX hosts' cores are not
this machine's.

Usage: python benchmarks/bench_dle_loader.py [CORPUS] [ROUNDS]
(default: the workplace corpus beside the checkout; writes benchmarks/results/dle-loader-cpu.json)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = ROOT.parent / "shared" / "data" / "imagenet-like"
OUT = ROOT / "benchmarks" / "results" / "dle-loader-cpu.json"
WORKERS, BATCH = 2, 64


def fast_collate(batch):
    """DeepLearningExamples' fast_collate: PIL images -> one uint8 NCHW tensor, labels."""
    images = [np.asarray(img, dtype=np.uint8) for img, _ in batch]
    h, w = images[0].shape[:2]
    out = torch.empty((len(images), 3, h, w), dtype=torch.uint8)
    for i, a in enumerate(images):
        out[i] = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))
    return out, torch.tensor([t for _, t in batch])


def dle_loader(root: str, size: int, bicubic: bool, autoaugment: bool):
    from torchvision import datasets, transforms
    from torchvision.transforms import AutoAugment, AutoAugmentPolicy, InterpolationMode

    mode = InterpolationMode.BICUBIC if bicubic else InterpolationMode.BILINEAR
    tf = [transforms.RandomResizedCrop(size, interpolation=mode), transforms.RandomHorizontalFlip()]
    if autoaugment:
        tf.append(AutoAugment(AutoAugmentPolicy.IMAGENET))
    ds = datasets.ImageFolder(root, transforms.Compose(tf))
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         collate_fn=fast_collate, persistent_workers=True)
    return loader, len(ds)


def main(argv: list[str]) -> int:
    from rich.progress import Progress

    from dlperf.bench.data import DataBenchConfig, _torchvision, measure_interleaved
    from dlperf.provenance import save_result

    corpus = Path(argv[0]) if argv else DEFAULT_CORPUS
    rounds = int(argv[1]) if len(argv) > 1 else 7
    if not corpus.is_dir():
        raise SystemExit(f"{corpus}: no such corpus folder (an ImageNet-layout JPEG folder)")
    pipelines = {
        "torchvision_float": _torchvision(DataBenchConfig(data=str(corpus), batch_size=BATCH,
                                                          workers=WORKERS)),
        "dle_resnet_224": dle_loader(str(corpus), 224, bicubic=False, autoaugment=False),
        "dle_efficientnet_b0_224": dle_loader(str(corpus), 224, bicubic=True, autoaugment=True),
        "dle_efficientnet_b4_380": dle_loader(str(corpus), 380, bicubic=True, autoaugment=True),
    }
    with Progress(transient=True) as bar:
        task = bar.add_task("loaders", total=rounds * len(pipelines))
        rates, epochs = measure_interleaved(pipelines, rounds, lambda: bar.advance(task))
    med = {k: statistics.median(v) for k, v in rates.items()}
    per_core = {k: v / WORKERS for k, v in med.items()}
    for k in med:
        print(f"{k:26s} {med[k]:7.0f} img/s on {WORKERS} workers = {per_core[k]:6.0f} per core "
              f"({min(rates[k]):.0f}-{max(rates[k]):.0f})")
    save_result(OUT, "dle-loader-cpu",
                {"corpus": str(corpus), "workers": WORKERS, "batch_size": BATCH, "rounds": rounds,
                 "threads": torch.get_num_threads()},
                {"img_per_s": med, "img_per_s_per_core": per_core,
                 "img_per_s_all_rounds": rates, "epochs_per_block": epochs,
                 "relative_to_torchvision_float": {k: v / med["torchvision_float"]
                                                  for k, v in med.items()}})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
