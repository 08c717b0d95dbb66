"""Turn a model name from the command line into an nn.Module and its example input.

* torchvision names (``resnet50``, ``vit_b_16``, ``mobilenet_v3_large`` ...), built on the meta
  device so construction allocates nothing and skips weight initialisation;
* ``path/to/file.py:factory`` where ``factory()`` returns an ``nn.Module``;
* ``gpt`` (dlperf.models.gpt) with its GPTConfig, and the published decoders it reproduces
  (``gpt2`` .. ``gpt2-xl``, ``mpt-125m`` .. ``mpt-70b``: dlperf.models.gpt.PRESETS);
* ``bert-base``, ``bert-large`` (dlperf.models.bert: SQuAD fine-tuning, sequence length 384);
  ``bert-base-pretrain``, ``bert-large-pretrain`` (the masked-LM head over every token,
  sequence length 128: pre-training phase 1);
* ``resnext101_32x4d``, ``se_resnext101_32x4d`` (dlperf.models.convnets: NVIDIA's variants);
* ``timm:NAME`` when timm is installed (an optional extra).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dlperf.errors import DlperfError, close_matches


@dataclass(frozen=True)
class ModelInput:
    """Per-sample input shape (no batch dimension) and dtype: images, features or token ids."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    kind: str = "image"  # image | features | tokens


def torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models())


def parse_input_shape(text: str) -> tuple[int, ...]:
    """'3,224,224' -> (3, 224, 224); one positive integer per dimension."""
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(","))  # no empty parts
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise DlperfError(f"--input-shape {text!r}: give positive integers like 3,224,224 or "
                          "a feature count like 1024 (no batch dimension)")
    return dims


def _construct(build, real: bool = False):
    """Build a model on the meta device (no memory, no init); builders that compute with
    tensors while constructing (regnet's .tolist()) are built on the CPU and moved to meta.
    ``real``: build on the CPU with initialised weights (for measurement)."""
    if not real:
        try:
            with torch.device("meta"):
                return build()
        except (NotImplementedError, RuntimeError) as exc:
            if "meta" not in str(exc):
                raise
    with torch.no_grad():
        model = build()
    if real or not isinstance(model, torch.nn.Module):
        return model
    return model.to("meta")


def _load_factory(target: str, real: bool = False) -> torch.nn.Module:
    path_text, _, factory_name = target.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise DlperfError(f"{path}: model file not found (expected path/to/file.py:factory)")
    spec = importlib.util.spec_from_file_location(f"dlperf_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # a script's argparse or exit() at import: not a crash, a hint
        raise DlperfError(f"{path}: the file exited while dlperf imported it (SystemExit "
                          f"{exc.code}); put the script's own code under `if __name__ == "
                          "\"__main__\":` so that importing it only defines the model") from None
    except Exception as exc:
        raise DlperfError(f"{path}: importing the model file failed: "
                          f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise DlperfError(f"{path}: no callable {factory_name!r}{close_matches(factory_name, names)}")
    try:
        model = _construct(factory, real)
    except SystemExit as exc:
        raise DlperfError(f"{target}: the factory exited (SystemExit {exc.code}) instead of "
                          "returning a model") from None
    except Exception as exc:
        raise DlperfError(f"{target}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise DlperfError(f"{target}: the factory returned {type(model).__name__}, "
                          "not a torch.nn.Module")
    return model


def build_model(name: str, gpt=None, num_classes: int | None = None, real: bool = False
                ) -> tuple[torch.nn.Module, ModelInput]:
    """(model on the meta device, default per-sample input) for a command-line model name.

    ``real=True`` builds it on the CPU with initialised weights instead (for --measure).
    """
    if ":" in name and name.rpartition(":")[0].endswith(".py"):
        return _load_factory(name, real), ModelInput((3, 224, 224))
    from dlperf.models.gpt import PRESETS

    if name in PRESETS:
        from dlperf.models.gpt import GPT

        cfg = gpt or PRESETS[name]
        # (one context-parallel rank's share of each sequence: all of it without)
        return (_construct(lambda: GPT(cfg), real),
                ModelInput((cfg.local_seq_len,), torch.long, "tokens"))
    if name.replace("_", "-") in ("bert-base", "bert-large"):
        from dlperf.models.bert import CONFIGS, BertForQuestionAnswering

        cfg = CONFIGS[name.replace("_", "-")]
        return (_construct(lambda: BertForQuestionAnswering(cfg), real),
                ModelInput((cfg.seq_len,), torch.long, "tokens"))
    if name.replace("_", "-") in ("bert-base-pretrain", "bert-large-pretrain"):
        from dlperf.models.bert import CONFIGS, PRETRAIN_SEQ_LEN, BertForPreTraining

        cfg = CONFIGS[name.replace("_", "-").removesuffix("-pretrain")]
        return (_construct(lambda: BertForPreTraining(cfg), real),
                ModelInput((PRETRAIN_SEQ_LEN,), torch.long, "tokens"))
    if name.startswith("timm:"):  # optional extra: pip install 'dlperf[timm]'
        try:
            import timm
        except ImportError:
            raise DlperfError(f"{name}: timm is not installed (pip install timm)") from None
        arch = name.split(":", 1)[1]
        if arch not in timm.list_models():
            raise DlperfError(f"unknown timm model {arch!r}"
                              f"{close_matches(arch, timm.list_models())}")
        kwargs = {"num_classes": num_classes} if num_classes else {}
        return (_construct(lambda: timm.create_model(arch, pretrained=False, **kwargs), real),
                ModelInput((3, 224, 224)))
    from dlperf.models.convnets import BUILDERS

    if name in BUILDERS:  # NVIDIA DeepLearningExamples ConvNets torchvision lacks
        kwargs = {"num_classes": num_classes} if num_classes else {}
        return _construct(lambda: BUILDERS[name](**kwargs), real), ModelInput((3, 224, 224))
    names = torchvision_names()
    if name not in names:
        known = [*names, *PRESETS, "bert-base", "bert-large", "bert-base-pretrain",
                 "bert-large-pretrain", *BUILDERS]
        raise DlperfError(f"unknown model {name!r}{close_matches(name, known)}; use a "
                          f"torchvision name, timm:NAME, gpt or a GPT preset "
                          f"({', '.join(p for p in PRESETS if p != 'gpt')}), bert-base, "
                          "bert-large (-pretrain), or path/to/file.py:factory")
    import torchvision

    # weights=None and weights_backbone=None: never download anything (detection and
    # segmentation builders fetch ImageNet backbone weights by default).
    kwargs = {"weights": None, **({"num_classes": num_classes} if num_classes else {})}
    default = ModelInput((3, 299, 299)) if name == "inception_v3" else ModelInput((3, 224, 224))
    if name.startswith(("r3d", "mc3", "r2plus1d", "s3d", "mvit", "swin3d")):
        default = ModelInput((3, 16, 112, 112))  # video models: C, T, H, W
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = False
    try:
        return _construct(lambda: torchvision.models.get_model(
            name, weights_backbone=None, **kwargs), real), default
    except TypeError:  # builders without a backbone argument
        return _construct(lambda: torchvision.models.get_model(name, **kwargs), real), default


def build_classifier(name: str, num_classes: int, meta: bool = False) -> torch.nn.Module:
    """An image classifier for training (``dlperf train``, the ladder, the trainer's FLOP
    count): dlperf's ``tiny``/``tiny-gn`` test networks, or any name ``build_model`` knows.
    ``meta=True``: on the meta device, without initialising weights."""
    if name in ("tiny", "tiny-gn"):
        from dlperf.models.tiny import TinyResNet

        return TinyResNet(num_classes, norm="bn" if name == "tiny" else "gn")
    model, _ = build_model(name, num_classes=num_classes, real=not meta)
    return model

