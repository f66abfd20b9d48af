"""Vision probe: run onnxopt, as a third-party user would, on torchvision and timm models.

Each model is built with random weights (``pretrained=False``; tiny widths or small images where
the constructor allows), put in eval mode and exported twice: ``torch.onnx.export(dynamo=False)``
(TorchScript) and ``dynamo=True``, with a dynamic batch axis and, where the model allows, dynamic
height and width. An exporter that fails is noted (``export FAIL``), not counted: that is not
onnxopt's bug. Then the CLI runs in a subprocess on each file, and each file gets one row:

- ``ort``:   ``optimize IN -o A --json`` exits 0 and validates (nodes before -> after),
- ``det``:   optimizing IN again, with ``--explain`` and without validation, writes the same bytes
  (so ``--explain`` also works and changes nothing),
- ``fixpt``: optimizing A changes nothing,
- ``onnx``:  ``--target onnx`` exits 0 and adds no com.microsoft op,
- ``attn``:  attention nodes fused (com.microsoft Attention / MultiHeadAttention) where the model
  has attention,
- ``bench``: with ``--bench``, the speed-up of A over IN at ORT_ENABLE_ALL (``x1.00``).

torchvision 0.28's wheel here cannot load its C++ ops on the CPU torch; ``--shim-path DIR`` puts a
folder holding ``tv_shim.py`` (a module that makes the models importable, see the session notes) on
``sys.path`` (and its ``site`` subfolder, where torchvision and timm may be installed) and imports
it before torchvision/timm. Neither package is a project dependency.

    nice python scripts/vision_probe.py --shim-path /work/probe_env [--only NAME] [--bench]
        [--exporter torchscript|dynamo] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realworld_probe import _bench, _cli, _first_error

EXPORTERS = ("torchscript", "dynamo")


@dataclass(frozen=True)
class Spec:
    name: str
    build: Callable[[], Any]  # -> torch.nn.Module (eval mode is set here)
    shape: tuple[int, ...] = (2, 3, 64, 64)
    dynamic_hw: bool = True  # the model runs at other heights/widths
    attention: bool = False  # the model has attention blocks worth fusing
    bench: bool = False  # time it with --bench


SPECS: list[Spec] = []


def _attention(name: str, build: Callable[[], Any], bench: bool = False) -> Spec:
    """A transformer at its fixed image size (position embeddings or fixed windows)."""
    return Spec(name, build, dynamic_hw=False, attention=True, bench=bench)


def _tv(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kwargs)

    return build


def _timm(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return build


def _tv_class(module: str, cls: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        return getattr(importlib.import_module(module), cls)(**kwargs)

    return build


def _swin_v2() -> Any:
    from torchvision.models import swin_transformer as st

    return st.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=32,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=[4, 4],
        block=st.SwinTransformerBlockV2,
        downsample_layer=st.PatchMergingV2,
    )


def _raft() -> Any:
    import torch
    import torchvision

    class Flow(torch.nn.Module):  # RAFT takes two images; the last flow estimate is the output
        def __init__(self) -> None:
            super().__init__()
            self.raft = torchvision.models.optical_flow.raft_small(weights=None)

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.raft(image, image.flip(-1), num_flow_updates=2)[-1]

    return Flow()


def _segmentation(name: str) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        import torchvision

        class Out(torch.nn.Module):  # the models return a dict {"out": ..., "aux": ...}
            def __init__(self) -> None:
                super().__init__()
                self.model = torchvision.models.get_model(
                    name, weights=None, weights_backbone=None, num_classes=4
                )

            def forward(self, image: torch.Tensor) -> torch.Tensor:
                return self.model(image)["out"]

        return Out()

    return build


TV = "torchvision.models"
SPECS += [
    Spec(
        "tv vit (tiny VisionTransformer)",
        _tv_class(
            f"{TV}.vision_transformer",
            "VisionTransformer",
            image_size=64,
            patch_size=16,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
        ),
        dynamic_hw=False,
        attention=True,
        bench=True,
    ),
    Spec(
        "tv swin (tiny SwinTransformer)",
        _tv_class(
            f"{TV}.swin_transformer",
            "SwinTransformer",
            patch_size=[4, 4],
            embed_dim=32,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=[4, 4],
        ),
        dynamic_hw=False,
        attention=True,
        bench=True,
    ),
    Spec("tv swin_v2 (tiny)", _swin_v2, dynamic_hw=False, attention=True),
    Spec(
        "tv maxvit (tiny MaxVit)",
        _tv_class(
            f"{TV}.maxvit",
            "MaxVit",
            input_size=(64, 64),
            stem_channels=16,
            partition_size=2,
            block_channels=[32, 64],
            block_layers=[1, 1],
            head_dim=16,
            stochastic_depth_prob=0.0,
            num_classes=10,
        ),
        dynamic_hw=False,
        attention=True,
    ),
    Spec("tv r3d_18", _tv("r3d_18"), (2, 3, 4, 32, 32)),
    Spec("tv mc3_18", _tv("mc3_18"), (2, 3, 4, 32, 32)),
    Spec("tv fcn_resnet50", _segmentation("fcn_resnet50")),
    Spec("tv deeplabv3_mobilenet_v3_large", _segmentation("deeplabv3_mobilenet_v3_large")),
    Spec("tv lraspp_mobilenet_v3_large", _segmentation("lraspp_mobilenet_v3_large"), bench=True),
    Spec("tv raft_small", _raft, (1, 3, 64, 64)),
]
SPECS += [
    _attention("timm vit_tiny", _timm("vit_tiny_patch16_224", img_size=64), bench=True),
    _attention("timm deit_tiny", _timm("deit_tiny_patch16_224", img_size=64)),
    _attention("timm levit_128s", _timm("levit_128s", img_size=64), bench=True),
    Spec("timm poolformer_s12", _timm("poolformer_s12")),
    Spec("timm mixer_s16", _timm("mixer_s16_224", img_size=64), dynamic_hw=False),
    Spec("timm resmlp_12", _timm("resmlp_12_224", img_size=64), dynamic_hw=False),
    _attention("timm cait_xxs24", _timm("cait_xxs24_224", img_size=64, depth=4)),
    _attention("timm coat_lite_tiny", _timm("coat_lite_tiny", img_size=64)),
    Spec("timm convmixer (tiny)", _tv_class("timm.models.convmixer", "ConvMixer", dim=64, depth=2)),
    Spec("timm ghostnet_100", _timm("ghostnet_100"), bench=True),
    Spec("timm rexnet_100", _timm("rexnet_100")),
    _attention("timm mobilevitv2_050", _timm("mobilevitv2_050")),
    _attention("timm edgenext_xx_small", _timm("edgenext_xx_small")),
    Spec("timm fastvit_t8", _timm("fastvit_t8")),
    _attention("timm efficientformer_l1", _timm("efficientformer_l1", img_size=64)),
    _attention("timm efficientformerv2_s0", _timm("efficientformerv2_s0", img_size=64)),
    _attention("timm tiny_vit_5m", _timm("tiny_vit_5m_224", img_size=64)),
    Spec("timm repvit_m0_9", _timm("repvit_m0_9")),
    _attention("timm pvt_v2_b0", _timm("pvt_v2_b0")),
    _attention("timm xcit_nano", _timm("xcit_nano_12_p16_224", img_size=64)),
]
# The classic CNNs last: the transformers and the odd ops above find more.
SPECS += [
    Spec("tv squeezenet1_1", _tv("squeezenet1_1"), bench=True),
    Spec("tv shufflenet_v2_x0_5", _tv("shufflenet_v2_x0_5"), bench=True),
    Spec("tv densenet121", _tv("densenet121")),
    Spec("tv googlenet", _tv("googlenet", aux_logits=False, init_weights=True)),
    Spec(
        "tv inception_v3", _tv("inception_v3", aux_logits=False, init_weights=True), (2, 3, 96, 96)
    ),
    Spec("tv mnasnet0_5", _tv("mnasnet0_5")),
    Spec("tv mobilenet_v3_small", _tv("mobilenet_v3_small"), bench=True),
    Spec("tv efficientnet_v2_s", _tv("efficientnet_v2_s")),
    Spec("tv regnet_y_400mf", _tv("regnet_y_400mf")),
    Spec("tv resnext50_32x4d", _tv("resnext50_32x4d")),
]


def export(spec: Spec, exporter: str, target: Path) -> str:
    """Export ``spec`` to ``target``; returns '' or why the exporter failed."""
    import torch

    torch.manual_seed(0)
    module = spec.build().eval()
    example = torch.randn(*spec.shape)
    dims = {0: "batch"}
    if spec.dynamic_hw:
        dims |= {len(spec.shape) - 2: "height", len(spec.shape) - 1: "width"}
    # No torch.no_grad(): under it nn.MultiheadAttention takes its fused fast path, which the
    # TorchScript exporter cannot export (aten::_native_multi_head_attention).
    common: dict[str, Any] = {"input_names": ["image"], "output_names": ["out"]}
    if exporter == "torchscript":
        common |= {"dynamic_axes": {"image": dims}, "dynamo": False}
    else:
        auto = torch.export.Dim.AUTO
        common |= {"dynamic_shapes": ({axis: auto for axis in dims},), "dynamo": True}
        common["external_data"] = False
    try:
        torch.onnx.export(module, (example,), str(target), **common)
    except Exception as exc:  # the exporter's own failure is noted, not counted
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first[:150]}"
    return ""


@dataclass
class Row:
    name: str
    cells: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _ops(path: Path) -> Counter[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node)


def _contrib(ops: Counter[str]) -> Counter[str]:
    return Counter({op: n for op, n in ops.items() if op.startswith("com.microsoft::")})


def _dims_args(spec: Spec) -> list[str]:
    """Validate dynamic H/W at sizes the model accepts (the generated 1, 2, ... may be too small)."""
    if not spec.dynamic_hw:
        return []
    side = spec.shape[-1]
    return ["--dim", f"batch=2,height={side},width={side + 32}"]


def probe(spec: Spec, exporter: str, work: Path, bench: bool) -> Row:
    row = Row(f"{spec.name} [{exporter}]")
    started = time.perf_counter()
    source = work / "model.onnx"
    failed = export(spec, exporter, source)
    if failed:
        row.cells["export"] = "FAIL"
        row.notes.append(f"exporter: {failed}")
        return row
    out = work / "out"
    out.mkdir(exist_ok=True)
    a, a2, aa, o = (out / f"{n}.onnx" for n in ("a", "a2", "aa", "o"))
    dims = _dims_args(spec)

    done = _cli(["optimize", str(source), "-o", str(a), "--json", *dims], cwd=work)
    if done.returncode or not a.exists():
        row.cells["ort"] = f"exit {done.returncode}"
        row.problems.append(f"ort: {_first_error(done)}")
        row.seconds = time.perf_counter() - started
        return row
    report = json.loads(done.stdout)
    row.cells["ort"] = f"{report['before']['nodes']}->{report['after']['nodes']}"
    if not (report["validation"] or {}).get("passed"):
        row.problems.append("ort: validation not passed")
    optimized_ops = _ops(a)
    if spec.attention:
        fused = sum(
            n
            for op, n in optimized_ops.items()
            if op.endswith(("::Attention", "::MultiHeadAttention"))
        )
        row.cells["attn"] = str(fused)

    # the same --dim: the sizes steer reorder-for-memory
    done = _cli(
        ["optimize", str(source), "-o", str(a2), "--explain", "--no-validate", *dims], cwd=work
    )
    same = done.returncode == 0 and a.read_bytes() == a2.read_bytes()
    row.cells["det"] = "ok" if same else "DIFF"
    if not same:
        why = _first_error(done) if done.returncode else "bytes differ"
        row.problems.append(f"det/explain: {why}")
    elif spec.attention:
        (work / "explain.txt").write_text(done.stdout + done.stderr)

    # validated once above; the second pass has to change nothing, so its bytes are the check
    done = _cli(["optimize", str(a), "-o", str(aa), "--json", "--no-validate", *dims], cwd=work)
    if done.returncode:
        row.cells["fixpt"] = f"exit {done.returncode}"
        row.problems.append(f"fixpt: {_first_error(done)}")
    elif a.read_bytes() != aa.read_bytes():
        again = json.loads(done.stdout)
        row.cells["fixpt"] = f"{again['before']['nodes']}->{again['after']['nodes']}"
        changed = [r["name"] for r in again["records"] if r["modified"]]
        row.problems.append(f"fixpt: changed by {','.join(dict.fromkeys(changed)) or 'bytes'}")
    else:
        row.cells["fixpt"] = "ok"

    done = _cli(["optimize", str(source), "-o", str(o), "--target", "onnx", *dims], cwd=work)
    if done.returncode:
        row.cells["onnx"] = f"exit {done.returncode}"
        row.problems.append(f"onnx: {_first_error(done)}")
    else:
        added = _contrib(_ops(o)) - _contrib(_ops(source))
        row.cells["onnx"] = "CONTRIB" if added else "ok"
        if added:
            row.problems.append(f"onnx: added {dict(added)}")

    if bench and spec.bench:
        _bench(row, source, a, work)
    row.seconds = time.perf_counter() - started
    return row


COLUMNS = ("export", "ort", "det", "fixpt", "onnx", "attn", "bench")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shim-path", type=Path, help="Folder holding tv_shim.py (imported first)."
    )
    parser.add_argument("--only", default="", help="Run the models whose name contains this.")
    parser.add_argument("--exporter", choices=EXPORTERS, action="append", help="Default: both.")
    parser.add_argument("--bench", action="store_true", help="Time the models marked for it.")
    parser.add_argument("--keep", type=Path, help="Work in this folder and keep the files.")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = parser.parse_args()
    if args.shim_path is not None:
        sys.path[:0] = [str(args.shim_path), str(args.shim_path / "site")]
        importlib.import_module("tv_shim")
    root = Path(tempfile.mkdtemp(prefix="vision_probe_")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    chosen = [s for s in SPECS if args.only.lower() in s.name.lower()]
    for index, spec in enumerate(chosen):
        for exporter in args.exporter or EXPORTERS:
            work = root / f"{index:02d}_{exporter}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            row = probe(spec, exporter, work, bench=args.bench)
            rows.append(row)
            if not args.json:
                if len(rows) == 1:
                    print(f"{'model':46} " + " ".join(f"{c:>9}" for c in COLUMNS), flush=True)
                cells = " ".join(f"{row.cells.get(c, '-'):>9}" for c in COLUMNS)
                verdict = "; ".join(row.problems + row.notes) or "ok"
                print(f"{row.name[:46]:46} {cells} {row.seconds:5.0f}s  {verdict}", flush=True)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        print(f"{sum(not r.problems for r in rows)}/{len(rows)} exports ok")
    return 0 if not any(r.problems for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
