"""The GPU path's logic, run on CPU tensors (torchvision's CPU JPEG decoder stands in for nvJPEG)."""

import numpy as np
import pytest
import torch

from dlperf.data.augment import CropPlan
from dlperf.data.gpu import GpuLoader, crop_resize_batch, plan_box
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.sources import open_source
from imagegen import cmyk_jpeg_bytes, jpeg_bytes, make_folder, png_bytes, smooth_rgb


def test_batched_crop_uses_each_samples_own_box():
    # Two different images, two different boxes, one flipped: one roi_align call must honour each.
    a = torch.from_numpy(smooth_rgb(60, 80, seed=1)).permute(2, 0, 1).contiguous()
    b = torch.from_numpy(smooth_rgb(90, 70, seed=2)).permute(2, 0, 1).contiguous()
    out = crop_resize_batch([a, b], [(10, 5, 42, 37), (0, 0, 70, 90)], [False, True], 32)
    assert out.shape == (2, 32, 32, 3) and out.dtype == torch.uint8
    # box of a is 32x32 at (x=10, y=5): no scaling, so it is the exact crop
    np.testing.assert_allclose(out[0].numpy(), a[:, 5:37, 10:42].permute(1, 2, 0).numpy(), atol=1)
    # b: full image shrunk to 32x32 then flipped: compare with an area resize of the flipped image
    import cv2

    ref = cv2.resize(b.permute(1, 2, 0).numpy()[:, ::-1].copy(), (32, 32),
                     interpolation=cv2.INTER_AREA)
    assert np.abs(out[1].numpy().astype(int) - ref.astype(int)).mean() < 2.0


def test_packed_crop_equals_the_crop_of_the_image_alone():
    # A box on the bottom-right border of an image smaller than the pack: the padding must act
    # like the image's own edge (roi_align clamps only at the pack's edge), not like zeros.
    small = torch.from_numpy(smooth_rgb(50, 70, seed=3)).permute(2, 0, 1).contiguous()
    big = torch.from_numpy(smooth_rgb(90, 120, seed=4)).permute(2, 0, 1).contiguous()
    box = (30.0, 14.0, 70.0, 50.0)  # right and bottom edges on the border of `small`
    alone = crop_resize_batch([small], [box], [False], 24)
    packed = crop_resize_batch([big, small], [(0, 0, 120, 90), box], [False, False], 24)
    assert torch.equal(packed[1], alone[0])


def test_eval_plan_box_is_the_box_before_resizing():
    # 256 x 384 image resized to 224 short side (x0.875) then centre crop 224: the box covers
    # the central 256 x 256 of the original.
    plan = CropPlan(0, 112, 224, 224, False, (224, 336))
    x1, y1, x2, y2 = plan_box(plan, 256, 384)
    assert (x1, y1, x2, y2) == pytest.approx((128, 0, 384, 256))


@pytest.fixture
def folder(tmp_path):
    root = make_folder(tmp_path / "ds", classes=2, per_class=6, size=(150, 200))
    (root / "class00" / "cmyk.JPEG").write_bytes(cmyk_jpeg_bytes(smooth_rgb(120, 160)))
    (root / "class01" / "png.JPEG").write_bytes(png_bytes(smooth_rgb(100, 130)))
    (root / "class01" / "broken.JPEG").write_bytes(jpeg_bytes(smooth_rgb(150, 150))[:-500])
    return root


def _decoder_or_skip(name):
    from dlperf.data.gpu import jpeg_batch_decoder
    from dlperf.errors import DlperfError

    try:
        got, _ = jpeg_batch_decoder(name)
    except DlperfError:
        pytest.skip(f"{name} not importable here")
    assert got == name


@pytest.mark.parametrize("decoder", ["torchvision", "torchcodec"])
def test_gpu_loader_matches_cpu_loader_crops(folder, decoder):
    _decoder_or_skip(decoder)
    src = open_source(folder)
    cfg = LoaderConfig(batch_size=5, size=48, threads=2, seed=11, drop_last=False,
                       max_bad_fraction=0.5)
    cpu = [(b.images.clone(), b.labels.clone(), b.indices.copy()) for b in Loader(src, cfg)]
    gpu_loader = GpuLoader(src, cfg, device="cpu", jpeg_decoder=decoder)
    assert gpu_loader.jpeg_decoder == decoder
    gpu = [(b.images, b.labels, b.indices) for b in gpu_loader]
    cpu_ids = np.concatenate([c[2] for c in cpu])
    gpu_ids = np.concatenate([g[2] for g in gpu])
    assert np.array_equal(cpu_ids, gpu_ids)  # same order, same samples skipped
    assert torch.equal(torch.cat([c[1] for c in cpu]), torch.cat([g[1] for g in gpu]))
    diff = (torch.cat([c[0] for c in cpu]).float() - torch.cat([g[0] for g in gpu]).float()).abs()
    # same crops and flips; different resampling filters (OpenCV area/bilinear after DCT scaling
    # vs roi_align's adaptive averaging): a few levels apart on smooth images
    assert diff.mean() < 4.0
    assert gpu_loader.fallbacks >= 1  # PNG and CMYK went to the CPU decoder
    assert "1 bad files skipped" in gpu_loader.reports[-1] and "broken.JPEG" in gpu_loader.reports[-1]


def test_gpu_loader_resume(folder):
    src = open_source(folder)
    cfg = LoaderConfig(batch_size=4, size=32, seed=2, max_bad_fraction=0.5)
    full = [b.images.clone() for b in GpuLoader(src, cfg, device="cpu")]
    ld = GpuLoader(src, cfg, device="cpu")
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = GpuLoader(src, cfg, device="cpu")
    rest.load_state_dict(state)
    tail = [b.images for b in rest]
    assert all(torch.equal(a, b) for a, b in zip(full[1:], tail)) and len(tail) == len(full) - 1


@pytest.mark.parametrize("decoder", ["torchvision", "torchcodec"])
def test_batch_decoders_apply_exif_orientation_and_reject_bad_files(decoder):
    from PIL import Image, ImageOps

    from dlperf.data.gpu import jpeg_batch_decoder
    from imagegen import exif_jpeg_bytes

    _decoder_or_skip(decoder)
    _, decode = jpeg_batch_decoder(decoder)
    arr = smooth_rgb(60, 90)
    datas = [exif_jpeg_bytes(arr, o) for o in (1, 6)]
    out = decode([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas], "cpu")
    import io

    for d, img in zip(datas, out):
        ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(d))).convert("RGB"))
        assert img.shape == (3, *ref.shape[:2])  # orientation 6: 90 x 60
        assert np.abs(img.permute(1, 2, 0).numpy().astype(int) - ref.astype(int)).mean() < 1.0
    with pytest.raises(RuntimeError):
        decode([torch.frombuffer(bytearray(png_bytes(arr)), dtype=torch.uint8)], "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_loader_needs_cuda(folder):
    from dlperf.errors import DlperfError

    with pytest.raises(DlperfError, match="no CUDA GPU"):
        GpuLoader(open_source(folder), LoaderConfig(), device="cuda")


def test_background_preparation_gives_the_same_batches_and_stops_cleanly(folder):
    import threading

    src = open_source(folder)
    cfg = LoaderConfig(batch_size=4, size=32, seed=5, max_bad_fraction=0.5, drop_last=False)
    inline = [(b.images.clone(), b.labels.clone(), b.indices.copy())
              for b in GpuLoader(src, cfg, device="cpu", ahead=0)]
    ahead = GpuLoader(src, cfg, device="cpu", ahead=3)
    background = [(b.images.clone(), b.labels.clone(), b.indices.copy()) for b in ahead]
    assert len(inline) == len(background) == len(ahead)
    for (a, la, ia), (b, lb, ib) in zip(inline, background):
        assert torch.equal(a, b) and torch.equal(la, lb) and np.array_equal(ia, ib)
    # the position is the consumer's, however far ahead the thread is
    ld = GpuLoader(src, cfg, device="cpu", ahead=3)
    it = iter(ld)
    next(it)
    assert ld.state_dict()["next_batch"] == 1
    it.close()  # leaving early stops the thread
    alive = [t for t in threading.enumerate() if t.name == "dlperf-gpu-loader"]
    assert not alive


def test_background_failure_is_raised_in_the_consumer(tmp_path):
    from dlperf.errors import DlperfError

    root = make_folder(tmp_path / "bad", classes=2, per_class=4, size=(40, 50))
    for f in sorted(root.rglob("*.JPEG"))[:6]:
        f.write_bytes(b"not a jpeg at all")
    ld = GpuLoader(open_source(root), LoaderConfig(batch_size=4, size=16, max_bad_fraction=0.1),
                   device="cpu", ahead=2)
    with pytest.raises(DlperfError, match="bad"):
        list(ld)


@pytest.mark.parametrize("decoder", ["torchvision", "torchcodec"])
def test_gpu_loader_cuts_prepared_files_to_the_crop(folder, tmp_path, decoder, monkeypatch):
    # Shards from `dlperf data prepare` carry restart markers: the GPU path decodes only the
    # part of each file under its crop and must give the same batches as decoding it whole.
    from dlperf.data import gpu
    from dlperf.data.prepare import prepare

    _decoder_or_skip(decoder)
    prepare(folder, tmp_path / "shards")
    src = open_source(tmp_path / "shards")
    cfg = LoaderConfig(batch_size=4, size=40, threads=2, seed=5, drop_last=False)
    whole = [(b.images.clone(), b.indices.copy()) for b in
             GpuLoader(src, cfg, device="cpu", jpeg_decoder=decoder, cut=False)]
    made = []
    real_cut = gpu.cut_to_plan
    monkeypatch.setattr(gpu, "cut_to_plan", lambda *a: made.append(real_cut(*a)) or made[-1])
    cut = [(b.images, b.indices) for b in
           GpuLoader(src, cfg, device="cpu", jpeg_decoder=decoder)]
    done = [m for m in made if m is not None]
    assert len(done) >= len(src) // 2  # most crops leave something out
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(whole, cut))
    diff = (torch.cat([a[0] for a in whole]).int() - torch.cat([b[0] for b in cut]).int()).abs()
    # same pixels in, same boxes up to an integer shift: roi_align's float sample positions
    # may round differently, by one level at most
    assert diff.max() <= 1 and (diff == 0).float().mean() > 0.99


def test_without_simplejpeg_the_gpu_decoder_still_gets_every_jpeg(folder, monkeypatch):
    # The GPU image has no simplejpeg: only the PNG and the CMYK file may go to the CPU.
    from dlperf.data import decode as D

    monkeypatch.setattr(D, "simplejpeg", None)
    cfg = LoaderConfig(batch_size=5, size=32, threads=2, seed=3, drop_last=False,
                       max_bad_fraction=0.5)
    ld = GpuLoader(open_source(folder), cfg, device="cpu")
    seen = []
    decode = ld._decode_batch
    ld._decode_batch = lambda tensors, device: seen.extend(tensors) or decode(tensors, device)
    n = sum(len(b) for b in ld)
    assert n == 14 and ld.fallbacks == 2  # 12 JPEGs + PNG + CMYK; the cut-off one skipped
    assert len(seen) >= 12


def test_a_bad_file_costs_a_few_decoder_calls_not_one_per_image(folder):
    # One cut-off JPEG among 16 fails the batched call; halving finds it in ~2 log2(16) calls.
    datas = [jpeg_bytes(smooth_rgb(40 + i, 50)) for i in range(16)]
    datas[11] = datas[11][:-200]
    ld = GpuLoader(open_source(folder), LoaderConfig(batch_size=16), device="cpu")
    calls = []
    decode = ld._decode_batch
    ld._decode_batch = lambda tensors, device: calls.append(len(tensors)) or decode(tensors, device)
    out = ld._decode_gpu(datas)
    assert [o is None for o in out] == [i == 11 for i in range(16)]
    assert all(o.shape == (3, 40 + i, 50) for i, o in enumerate(out) if o is not None)
    assert len(calls) <= 9 and calls[0] == 16  # 1 + 2 per level, 4 levels (not 1 + 16)
