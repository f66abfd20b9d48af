"""Legacy probe: the models users download from the ONNX Model Zoo or get from older converters.

Each form imitates, with onnx.helper / onnx text, a graph of the opset 6-12 era in the attribute
forms later opsets turned into inputs (Slice/Pad/Clip/Squeeze/Split/TopK/Upsample attributes,
BatchNormalization ``spatial``, Dropout ``ratio``), the zoo's classic blocks (tiny-YOLOv2's
ImageScaler, the super-resolution pixel shuffle, MNIST-int8's QLinearConv, SSD-style
NonMaxSuppression post-processing), old bookkeeping (IR 3, sparse initializers, string and
sequence values), and the real outputs of converters that run here: skl2onnx and the TorchScript
exporter at opsets 9 and 11. Rows and columns are those of ``realworld_probe.py``, whose runner
this reuses.

    nice python scripts/legacy_probe.py [--only SUBSTRING] [--no-bench] [--keep DIR] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx.parser

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realworld_probe import Form, main, registry, same_interface

T = onnx.TensorProto
FORMS: list[Form] = []
form = registry(FORMS)


def _text(source: str, path: Path, **weights: np.ndarray) -> Path:
    """Parse an onnx-text model, add ``weights`` as initializers (seeded random arrays), save it."""
    model = onnx.parser.parse_model(source)
    model.graph.initializer.extend(onh.from_array(v, k) for k, v in weights.items())
    if model.ir_version < 4:  # IR 3 wants every initializer among the graph inputs too
        model.graph.input.extend(
            oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in weights.items()
        )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _rand(*shape: int, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed + len(shape)).standard_normal(shape) * scale).astype(
        np.float32
    )


def _conv(cout: int = 8, cin: int = 3, **more: np.ndarray) -> dict[str, np.ndarray]:
    """Weights ``w`` [cout, cin, 3, 3] and bias ``b`` of a 3x3 Conv, and ``more``."""
    return {"w": _rand(cout, cin, 3, 3), "b": _rand(cout), **more}


def _bn(channels: int = 8) -> dict[str, np.ndarray]:
    """BatchNormalization scale ``g``, bias ``be``, mean ``mu`` and variance ``var``."""
    return {
        "g": _rand(channels) + 1.0,
        "be": _rand(channels, seed=1),
        "mu": _rand(channels, seed=2),
        "var": np.abs(_rand(channels, seed=3)) + 0.5,
    }


def _nothing(base: Path) -> None:
    """The legacy forms build their own models: no shared base export."""


# ---------------------------------------------------------------- attributes later opsets made inputs


@form("Slice-1 starts/ends/axes attributes, Conv (opset 9)", same_interface)
def _slice_attrs(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 16, 16] x) => (float[N, 8, 6, 14] y, float[N, 2, 16, 16] head) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            s = Slice <starts = [1, 1], ends = [7, 1000000], axes = [2, 3]> (c)
            t = Slice <starts = [0, -15], ends = [9223372036854775807, -1]> (s)
            y = Relu(t)
            head = Slice <starts = [0], ends = [2], axes = [1]> (x)
        }
        """,
        work / "slice1.onnx",
        **_conv(),
    )


for _mode in ("constant", "reflect", "edge"):

    def _pad_attrs(base: Path, work: Path, mode: str = _mode) -> Path:
        value = ", value = 0.0" if mode == "constant" else ""
        return _text(
            f"""
            <ir_version: 4, opset_import: ["" : 9]>
            g (float[N, 3, 12, 12] x) => (float[N, 8, 12, 12] y) {{
                p = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], mode = "{mode}"{value}> (x)
                c = Conv (p, w, b)
                y = Relu(c)
            }}
            """,
            work / f"pad2_{mode}.onnx",
            **_conv(),
        )

    form(f"Pad-2 pads attribute mode={_mode} before Conv (opset 9)", same_interface)(_pad_attrs)


@form("Clip-6 min/max attributes (ReLU6 after Conv, opset 9)", same_interface)
def _clip_attrs(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y, float[N, 8, 8, 8] z) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            y = Clip <min = 0.0, max = 6.0> (c)
            d = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            z = Clip <max = 0.5> (d)
        }
        """,
        work / "clip6.onnx",
        w=_rand(8, 3, 3, 3, scale=3.0),
        b=_rand(8),
    )


@form("Squeeze/Unsqueeze/ReduceMean/ReduceSum axes attributes (opset 11)", same_interface)
def _axes_attrs(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[N, 4, 8, 8] x) => (float[N, 4] y, float[N, 1, 4] z, float[N] s) {
            m = ReduceMean <axes = [2, 3], keepdims = 1> (x)
            q = Squeeze <axes = [2, 3]> (m)
            y = Relu(q)
            z = Unsqueeze <axes = [1]> (q)
            s0 = ReduceSum <axes = [-1], keepdims = 0> (q)
            u = Unsqueeze <axes = [0, 2]> (s0)
            s = Squeeze <axes = [0, 2]> (u)
        }
        """,
        work / "axes11.onnx",
    )


@form("Split-2 split attribute, equal and uneven, Concat (opset 11)", same_interface)
def _split_attrs(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[N, 12] x) => (float[N, 12] y, float[N, 4] e) {
            a, b, c = Split <axis = 1, split = [2, 4, 6]> (x)
            d, e, f = Split <axis = -1> (x)
            t = Tanh(b)
            y = Concat <axis = 1> (c, t, a)
        }
        """,
        work / "split2.onnx",
    )


@form("TopK-1 k attribute (opset 9)", same_interface)
def _topk1(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 10] x) => (float[N, 3] v, int64[N, 3] i) {
            s = Softmax <axis = 1> (x)
            v, i = TopK <k = 3, axis = -1> (s)
        }
        """,
        work / "topk1.onnx",
    )


@form("TopK-10 k from a Constant (opset 10)", same_interface)
def _topk10(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 5, opset_import: ["" : 10]>
        g (float[N, 10] x) => (float[N, 3] v, int64[N, 3] i) {
            k = Constant <value = int64[1] {3}> ()
            s = Softmax <axis = 1> (x)
            v, i = TopK <axis = 1> (s, k)
        }
        """,
        work / "topk10.onnx",
    )


@form("Upsample-7 scales attribute, nearest and linear (opset 7)", same_interface)
def _upsample7(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 7]>
        g (float[1, 3, 8, 8] x) => (float[1, 8, 16, 16] y, float[1, 8, 16, 16] z) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            y = Upsample <mode = "nearest", scales = [1.0, 1.0, 2.0, 2.0]> (c)
            z = Upsample <mode = "linear", scales = [1.0, 1.0, 2.0, 2.0]> (c)
        }
        """,
        work / "upsample7.onnx",
        **_conv(),
    )


@form("Upsample-9 scales from a Constant / computed from Shape (opset 9)", same_interface)
def _upsample9(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, H, W] x) => (float[N, 8, H2, W2] y, float[N, 3, H3, W3] z) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
            y = Upsample <mode = "nearest"> (c, sc)
            shape = Shape(x)
            fshape = Cast <to = 1> (shape)
            twice = Mul(fshape, sc)
            ratio = Div(twice, fshape)
            z = Upsample <mode = "linear"> (x, ratio)
        }
        """,
        work / "upsample9.onnx",
        **_conv(),
    )


@form("Resize-10 scales input, nearest and linear (opset 10)", same_interface)
def _resize10(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 5, opset_import: ["" : 10]>
        g (float[N, 3, H, W] x) => (float[N, 8, H2, W2] y, float[N, 8, H3, W3] z) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
            y = Resize <mode = "nearest"> (c, sc)
            z = Resize <mode = "linear"> (c, sc)
        }
        """,
        work / "resize10.onnx",
        **_conv(),
    )


@form("Resize-11 roi/scales/sizes, align_corners, cubic, tf_crop_and_resize (opset 11)")
def _resize11(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[N, 3, 8, 8] x) => (float[N, 3, 16, 16] a, float[N, 3, 16, 16] b2,
                                    float[N, 3, 12, 12] c, float[N, 3, 4, 4] d) {
            roi = Constant <value = float[0] {}> ()
            sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
            a = Resize <mode = "linear", coordinate_transformation_mode = "align_corners"> (x, roi, sc)
            b2 = Resize <mode = "cubic", cubic_coeff_a = -0.5,
                         coordinate_transformation_mode = "pytorch_half_pixel"> (x, roi, sc)
            shape = Shape(x)
            nc = Slice(shape, zero, two)
            hw = Constant <value = int64[2] {12, 12}> ()
            sizes = Concat <axis = 0> (nc, hw)
            none = Constant <value = float[0] {}> ()
            c = Resize <mode = "nearest", nearest_mode = "floor",
                        coordinate_transformation_mode = "asymmetric"> (x, roi, none, sizes)
            box = Constant <value = float[8] {0.0, 0.0, 0.2, 0.2, 1.0, 1.0, 0.8, 0.8}> ()
            sizes4 = Concat <axis = 0> (nc, four)
            d = Resize <mode = "linear", coordinate_transformation_mode = "tf_crop_and_resize",
                        extrapolation_value = 0.0> (x, box, none, sizes4)
        }
        """,
        work / "resize11.onnx",
        zero=np.array([0], np.int64),
        two=np.array([2], np.int64),
        four=np.array([4, 4], np.int64),
    )


@form("BatchNormalization-7 spatial=1 after Conv, Dropout-7 ratio (opset 8, IR 3)", same_interface)
def _bn7(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 8]>
        g (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            n = BatchNormalization <epsilon = 0.00001, momentum = 0.9, spatial = 1> (c, g, be, mu, var)
            r = Relu(n)
            y = Dropout <ratio = 0.5> (r)
        }
        """,
        work / "bn7.onnx",
        **_conv(),
        **_bn(),
    )


@form(
    "BatchNormalization-6 is_test, Add-6 broadcast/axis (opset 6)",
    refused="Could not find an implementation for Add(6)",
)
def _bn6(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 6]>
        g (float[1, 3, 8, 8] x) => (float[1, 8, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w)
            a = Add <broadcast = 1, axis = 1> (c, b)
            n = BatchNormalization <epsilon = 0.00001, is_test = 1, spatial = 1> (a, g, be, mu, var)
            y = Relu(n)
        }
        """,
        work / "bn6.onnx",
        **_conv(),
        **_bn(),
    )


@form("Dropout-10 mask output used / unused, Dropout-12 ratio input (opset 10 / 12)")
def _dropout_mask(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 5, opset_import: ["" : 10]>
        g (float[N, 8] x) => (float[N, 8] y, bool[N, 8] mask) {
            d, mask = Dropout <ratio = 0.25> (x)
            e, unused_mask = Dropout <ratio = 0.1> (d)
            y = Relu(e)
        }
        """,
        work / "dropout10.onnx",
    )


@form("Dropout-12 ratio/training_mode inputs, mask used (opset 12)")
def _dropout12(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 7, opset_import: ["" : 12]>
        g (float[N, 8] x) => (float[N, 8] y, bool[N, 8] mask) {
            ratio = Constant <value = float {0.3}> ()
            off = Constant <value = bool {0}> ()
            d, mask = Dropout (x, ratio, off)
            f = Cast <to = 1> (mask)
            m = Mul(d, f)
            y = Relu(m)
        }
        """,
        work / "dropout12.onnx",
    )


@form("AlexNet/GoogLeNet blocks: LRN, MaxPool with Indices, GlobalLpPool (opset 9)")
def _alexnet(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 16, 16] x) => (float[N, 10] y, int64[N, 8, 8, 8] idx, float[N, 8, 1, 1] lp) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            r = Relu(c)
            n = LRN <size = 5, alpha = 0.0001, beta = 0.75, bias = 1.0> (r)
            p, idx = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (n)
            lp = GlobalLpPool <p = 2> (p)
            a = AveragePool <kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1],
                             count_include_pad = 0> (p)
            g = GlobalAveragePool(a)
            f = Flatten <axis = 1> (g)
            y = Gemm <transB = 1> (f, fw, fb)
        }
        """,
        work / "alexnet.onnx",
        w=_rand(8, 3, 3, 3),
        b=_rand(8),
        fw=_rand(10, 8),
        fb=_rand(10),
    )


@form("style transfer: InstanceNormalization, reflect Pad-2, Upsample-9 (opset 9)")
def _style_transfer(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[1, 3, 16, 16] x) => (float[1, 3, 32, 32] y) {
            p = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], mode = "reflect"> (x)
            c = Conv (p, w, b)
            n = InstanceNormalization <epsilon = 0.00001> (c, s, bi)
            r = Relu(n)
            sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
            u = Upsample <mode = "nearest"> (r, sc)
            p2 = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], mode = "reflect"> (u)
            c2 = Conv (p2, w2, b2)
            t = Tanh(c2)
            k = Constant <value = float {150.0}> ()
            y = Mul(t, k)
        }
        """,
        work / "style.onnx",
        w=_rand(8, 3, 3, 3),
        b=_rand(8),
        s=_rand(8) + 1.0,
        bi=_rand(8),
        w2=_rand(3, 8, 3, 3),
        b2=_rand(3),
    )


@form("Flatten axis 0/1/3, Gemm transA/transB/alpha/beta, MatMul+Add (opset 9)")
def _flatten_gemm(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 4, 3, 2] x) => (float[N, 5] b, float[N, 5] c, float[N, 5] d, float[M, 5] e) {
            f2 = Flatten <axis = 1> (x)
            b = Gemm <alpha = 0.5, beta = 2.0, transB = 1> (f2, w24, b5)
            ft = Transpose(f2)
            c = Gemm <transA = 1> (ft, w24t, b5)
            m = MatMul(f2, w24t)
            d = Add(m, b5)
            fl = Flatten <axis = 3> (x)
            e0 = Gemm (fl, w2, b5)
            f0 = Flatten <axis = 0> (e0)
            e = Reshape(f0, m5)
        }
        """,
        work / "flatten_gemm.onnx",
        w24=_rand(5, 24),
        w24t=_rand(24, 5),
        b5=_rand(5),
        w2=_rand(2, 5),
        m5=np.array([-1, 5], np.int64),
    )


@form(
    "Gemm-6 broadcast attribute (opset 6)", refused="Could not find an implementation for Gemm(6)"
)
def _gemm6(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 6]>
        g (float[2, 4] x) => (float[2, 5] y) {
            y = Gemm <broadcast = 1, transB = 1> (x, w, b)
        }
        """,
        work / "gemm6.onnx",
        w=_rand(5, 4),
        b=_rand(5),
    )


@form("Reshape with 0/-1 constants, Shape-Gather-Unsqueeze-Concat-Reshape (opset 9)")
def _reshape_chain(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x) => (float[N, 512] y, float[N, 8, 64] z, float[N, 10] w) {
            c = Conv <pads = [1, 1, 1, 1]> (x, cw, cb)
            zm = Constant <value = int64[3] {0, 8, -1}> ()
            z = Reshape(c, zm)
            shape = Shape(c)
            idx = Constant <value = int64 {0}> ()
            n = Gather <axis = 0> (shape, idx)
            n1 = Unsqueeze <axes = [0]> (n)
            minus = Constant <value = int64[1] {-1}> ()
            target = Concat <axis = 0> (n1, minus)
            y = Reshape(c, target)
            yr = Relu(y)
            w = Gemm <transB = 1> (yr, fw, fb)
        }
        """,
        work / "reshape_chain.onnx",
        cw=_rand(8, 3, 3, 3),
        cb=_rand(8),
        fw=_rand(10, 512, scale=0.05),
        fb=_rand(10),
    )


@form("pre-opset-9 Reshape chain through Cast/Mul of the Shape (keras2onnx style, opset 8)")
def _reshape_keras(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 8]>
        g (float[N, 4, 6] x) => (float[N, 24] y, float[N, 6, 4] t) {
            shape = Shape(x)
            f = Cast <to = 1> (shape)
            k = Constant <value = float[3] {1.0, 1.0, 4.0}> ()
            prod = Mul(f, k)
            i = Cast <to = 7> (prod)
            s = Slice <starts = [0], ends = [1], axes = [0]> (i)
            tail = Constant <value = int64[1] {24}> ()
            target = Concat <axis = 0> (s, tail)
            y = Reshape(x, target)
            t = Transpose <perm = [0, 2, 1]> (x)
        }
        """,
        work / "reshape_keras.onnx",
    )


@form("tiny-YOLOv2: ImageScaler, Conv+BN-7+LeakyRelu, MaxPool (opset 8, IR 3)", same_interface)
def _tiny_yolo(base: Path, work: Path) -> Path:
    weights: dict[str, np.ndarray] = {}
    lines, prev, cin = [], "scaled", 3
    for i, cout in enumerate((8, 16)):
        weights |= {
            f"w{i}": _rand(cout, cin, 3, 3, seed=i),
            f"g{i}": _rand(cout, seed=i) + 1.0,
            f"be{i}": _rand(cout, seed=i + 10),
            f"mu{i}": _rand(cout, seed=i + 20),
            f"var{i}": np.abs(_rand(cout, seed=i + 30)) + 0.5,
        }
        lines += [
            f"c{i} = Conv <pads = [1, 1, 1, 1], kernel_shape = [3, 3]> ({prev}, w{i})",
            f"n{i} = BatchNormalization <epsilon = 0.00001> (c{i}, g{i}, be{i}, mu{i}, var{i})",
            f"l{i} = LeakyRelu <alpha = 0.1> (n{i})",
            f"p{i} = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (l{i})",
        ]
        prev, cin = f"p{i}", cout
    weights |= {"wo": _rand(5, 16, 1, 1), "bo": _rand(5)}
    body = "\n".join(lines)
    return _text(
        f"""
        <ir_version: 3, opset_import: ["" : 8]>
        g (float[1, 3, 16, 16] image) => (float[1, 5, 4, 4] grid) {{
            scaled = ImageScaler <bias = [-0.5, -0.4, -0.3], scale = 0.0039> (image)
            {body}
            grid = Conv <kernel_shape = [1, 1]> (p1, wo, bo)
        }}
        """,
        work / "tiny_yolov2.onnx",
        **weights,
    )


@form("super-resolution: Conv, Reshape/Transpose pixel shuffle (opset 9)")
def _super_resolution(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[1, 1, 8, 8] x) => (float[1, 1, 24, 24] y) {
            c1 = Conv <pads = [2, 2, 2, 2], kernel_shape = [5, 5]> (x, w1, b1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1, 1, 1, 1], kernel_shape = [3, 3]> (r1, w2, b2)
            r2 = Relu(c2)
            a = Reshape(r2, s6)
            t = Transpose <perm = [0, 1, 4, 2, 5, 3]> (a)
            y = Reshape(t, s4)
        }
        """,
        work / "super_resolution.onnx",
        w1=_rand(8, 1, 5, 5),
        b1=_rand(8),
        w2=_rand(9, 8, 3, 3),
        b2=_rand(9),
        s6=np.array([1, 1, 3, 3, 8, 8], np.int64),
        s4=np.array([1, 1, 24, 24], np.int64),
    )


@form("DepthToSpace DCR/CRD and SpaceToDepth (opset 11)")
def _depth_to_space(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[N, 3, 8, 8] x) => (float[N, 2, 16, 16] a, float[N, 2, 16, 16] b, float[N, 12, 4, 4] s) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, bias)
            a = DepthToSpace <blocksize = 2, mode = "DCR"> (c)
            b = DepthToSpace <blocksize = 2, mode = "CRD"> (c)
            s = SpaceToDepth <blocksize = 2> (x)
        }
        """,
        work / "depth_to_space.onnx",
        w=_rand(8, 3, 3, 3),
        bias=_rand(8),
    )


@form("Einsum bilinear / batched matmul / transpose equations (opset 12)")
def _einsum(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 7, opset_import: ["" : 12]>
        g (float[N, 4, 6] x, float[N, 6, 5] y) => (float[N, 4, 5] a, float[N, 6, 4] t, float[N] tr) {
            a = Einsum <equation = "bij,bjk->bik"> (x, y)
            t = Einsum <equation = "bij->bji"> (x)
            p = Einsum <equation = "bij,jk->bik"> (x, w)
            p2 = Einsum <equation = "bik,kj->bij"> (p, v)
            tr = Einsum <equation = "bii->b"> (p2)
        }
        """,
        work / "einsum.onnx",
        w=_rand(6, 5),
        v=_rand(5, 4),
    )


@form("MNIST-int8: QuantizeLinear, QLinearConv, QLinearMatMul, DequantizeLinear (opset 10)")
def _mnist_int8(base: Path, work: Path) -> Path:
    rng = np.random.default_rng(0)
    return _text(
        """
        <ir_version: 5, opset_import: ["" : 10]>
        g (float[1, 1, 8, 8] x) => (float[1, 10] y) {
            xs = Constant <value = float {0.02}> ()
            xz = Constant <value = uint8 {128}> ()
            q = QuantizeLinear(x, xs, xz)
            ys = Constant <value = float {0.05}> ()
            yz = Constant <value = uint8 {120}> ()
            c = QLinearConv <pads = [1, 1, 1, 1], strides = [2, 2]> (q, xs, xz, w, ws, wz, ys, yz, cb)
            f = Reshape(c, flat)
            ms = Constant <value = float {0.1}> ()
            mz = Constant <value = uint8 {100}> ()
            m = QLinearMatMul(f, ys, yz, fw, fws, fwz, ms, mz)
            y = DequantizeLinear(m, ms, mz)
        }
        """,
        work / "mnist_int8.onnx",
        w=rng.integers(0, 255, (4, 1, 3, 3)).astype(np.uint8),
        ws=np.array(0.01, np.float32),
        wz=np.array(128, np.uint8),
        cb=rng.integers(-100, 100, 4).astype(np.int32),
        flat=np.array([1, 64], np.int64),
        fw=rng.integers(0, 255, (64, 10)).astype(np.uint8),
        fws=np.array(0.01, np.float32),
        fwz=np.array(128, np.uint8),
    )


# ---------------------------------------------------------------- control flow of the opset-11 era


@form("SSD-style post-processing: TopK, NonMaxSuppression, Gather, NonZero (opset 11)")
def _ssd_post(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[1, B, 4] boxes, float[1, C, B] scores) => (int64[K, 3] selected, float[K] kept,
                                                          int64[M] nz, float[1, 5] top) {
            maxo = Constant <value = int64[1] {5}> ()
            iou = Constant <value = float[1] {0.5}> ()
            thr = Constant <value = float[1] {0.1}> ()
            selected = NonMaxSuppression <center_point_box = 0> (boxes, scores, maxo, iou, thr)
            col = Constant <value = int64[1] {2}> ()
            bi = Gather <axis = 1> (selected, col)
            bif = Squeeze <axes = [1]> (bi)
            s0 = Squeeze <axes = [0]> (scores)
            flat = Reshape(s0, minus1)
            kept = Gather <axis = 0> (flat, bif)
            pos = Greater(flat, half)
            nzi = NonZero(pos)
            nz = Squeeze <axes = [0]> (nzi)
            k5 = Constant <value = int64[1] {5}> ()
            sm = ReduceMax <axes = [1], keepdims = 0> (scores)
            top, topi = TopK <axis = 1, largest = 1, sorted = 1> (sm, k5)
        }
        """,
        work / "ssd_post.onnx",
        minus1=np.array([-1], np.int64),
        half=np.array(0.5, np.float32),
    )


@form("YOLO-style Loop over classes with If and a scan output (opset 11)")
def _yolo_loop(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[C, B] scores) => (float[C] best, float[C, B] masked, int64 count) {
            shape = Shape(scores)
            zero = Constant <value = int64 {0}> ()
            c = Gather <axis = 0> (shape, zero)
            yes = Constant <value = bool {1}> ()
            init = Constant <value = int64 {0}> ()
            count, best, masked = Loop (c, yes, init) <body = body (int64 i, bool cond, int64 acc) => (bool cond_out, int64 acc_out, float best_i, float[B] row_out) {
                cond_out = Identity(cond)
                row = Gather <axis = 0> (scores, i)
                best_i = ReduceMax <keepdims = 0> (row)
                half = Constant <value = float {0.5}> ()
                big = Greater(best_i, half)
                one = Constant <value = int64 {1}> ()
                acc_out = If (big) <then_branch = t () => (int64 a1) { a1 = Add(acc, one) },
                                    else_branch = e () => (int64 a2) { a2 = Identity(acc) }>
                keep = Greater(row, half)
                kf = Cast <to = 1> (keep)
                row_out = Mul(row, kf)
            }>
        }
        """,
        work / "yolo_loop.onnx",
    )


@form("Scan-8 with batch axis and sequence_lens (opset 8)")
def _scan8(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 8]>
        g (float[2, 4] h0, float[2, T, 4] xs) => (float[2, 4] h, float[2, T, 4] ys) {
            h, ys = Scan <num_scan_inputs = 1, body = body (float[4] h_in, float[4] x_t) => (float[4] h_out, float[4] y_t) {
                m = MatMul(x_t, w)
                s = Add(h_in, m)
                h_out = Tanh(s)
                y_t = Identity(h_out)
            }> (, h0, xs)
        }
        """,
        work / "scan8.onnx",
        w=_rand(4, 4),
    )


@form("Scan-9 scan_input_axes/scan_output_axes, RNN cell body (opset 9)")
def _scan9(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[2, 4] h0, float[T, 2, 4] xs) => (float[2, 4] h, float[2, T, 4] ys) {
            h, ys = Scan <num_scan_inputs = 1, scan_input_axes = [0], scan_output_axes = [1],
                          body = body (float[2, 4] h_in, float[2, 4] x_t) => (float[2, 4] h_out, float[2, 4] y_t) {
                m = MatMul(x_t, w)
                n = MatMul(h_in, u)
                s = Add(n, m)
                h_out = Tanh(s)
                y_t = Identity(h_out)
            }> (h0, xs)
        }
        """,
        work / "scan9.onnx",
        w=_rand(4, 4),
        u=_rand(4, 4, seed=3),
    )


# ---------------------------------------------------------------- old bookkeeping


@form("IR 3, no value_info, every weight also a graph input, opset 7", same_interface)
def _ir3_inputs(base: Path, work: Path) -> Path:
    w, b = _rand(8, 3, 3, 3), _rand(8)
    graph = oh.make_graph(
        [
            oh.make_node("Conv", ["data_0", "conv1_w_0", "conv1_b_0"], ["conv1_1"], pads=[1] * 4),
            oh.make_node("Relu", ["conv1_1"], ["conv1_2"]),
            oh.make_node("GlobalAveragePool", ["conv1_2"], ["pool_1"]),
            oh.make_node("Reshape", ["pool_1", "shape_0"], ["flat_1"]),
            oh.make_node("Softmax", ["flat_1"], ["prob_1"]),
        ],
        "squeezenet-like",
        [
            oh.make_tensor_value_info("data_0", T.FLOAT, [1, 3, 8, 8]),
            oh.make_tensor_value_info("conv1_w_0", T.FLOAT, [8, 3, 3, 3]),
            oh.make_tensor_value_info("conv1_b_0", T.FLOAT, [8]),
            oh.make_tensor_value_info("shape_0", T.INT64, [2]),
        ],
        [oh.make_tensor_value_info("prob_1", T.FLOAT, [1, 8])],
        [
            onh.from_array(w, "conv1_w_0"),
            onh.from_array(b, "conv1_b_0"),
            onh.from_array(np.array([1, 8], np.int64), "shape_0"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 7)], ir_version=3)
    model.producer_name, model.producer_version = "onnx-caffe2", ""
    onnx.save(model, str(work / "squeezenet_ir3.onnx"))
    return work / "squeezenet_ir3.onnx"


@form("sparse_initializer weights feeding MatMul (opset 11)")
def _sparse(base: Path, work: Path) -> Path:
    dense = np.zeros((8, 6), np.float32)
    dense[[0, 2, 5, 7], [1, 3, 0, 5]] = [1.0, -2.0, 0.5, 3.0]
    flat = np.flatnonzero(dense)
    values = onh.from_array(dense.reshape(-1)[flat], "sw")
    indices = onh.from_array(flat.astype(np.int64), "")
    sparse = oh.make_sparse_tensor(values, indices, [8, 6])
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "sw"], ["m"]),
            oh.make_node("Add", ["m", "b"], ["y"]),
        ],
        "sparse",
        [oh.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["N", 6])],
        [onh.from_array(_rand(6), "b")],
        sparse_initializer=[sparse],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=6)
    onnx.checker.check_model(model)
    onnx.save(model, str(work / "sparse.onnx"))
    return work / "sparse.onnx"


@form("string input: LabelEncoder string->int64, Identity, string output (opset 10, ml 2)")
def _strings(base: Path, work: Path) -> Path:
    # StringNormalizer is what zoo text models use, but ORT needs an en_US.UTF-8 locale for it.
    return _text(
        """
        <ir_version: 5, opset_import: ["" : 10, "ai.onnx.ml" : 2]>
        g (string[N] words, float[N] x) => (int64[N] ids, string[N] same, float[N] y) {
            ids = ai.onnx.ml.LabelEncoder <keys_strings = ["the", "a", "cat"], values_int64s = [1, 2, 3],
                                           default_int64 = 0> (words)
            same = Identity(words)
            f = Cast <to = 1> (ids)
            s = Add(x, f)
            y = Relu(s)
        }
        """,
        work / "strings.onnx",
    )


@form("sequence values: SplitToSequence, SequenceAt, ConcatFromSequence, seq output (opset 11)")
def _sequences(base: Path, work: Path) -> Path:
    seq_out = oh.make_sequence_type_proto(oh.make_tensor_type_proto(T.FLOAT, ["N", 2]))
    nodes = [
        oh.make_node("SplitToSequence", ["x", "two"], ["seq"], axis=1),
        oh.make_node("SequenceLength", ["seq"], ["n"]),
        oh.make_node("SequenceAt", ["seq", "zero"], ["first"]),
        oh.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=0, new_axis=1),
        oh.make_node("Relu", ["first"], ["r"]),
        oh.make_node("SequenceConstruct", ["r", "first"], ["pair"]),
        oh.make_node("SequenceInsert", ["pair", "r"], ["triple"]),
        oh.make_node("ConcatFromSequence", ["triple"], ["cat"], axis=1),
    ]
    graph = oh.make_graph(
        nodes,
        "sequences",
        [oh.make_tensor_value_info("x", T.FLOAT, ["N", 6])],
        [
            oh.make_tensor_value_info("n", T.INT64, []),
            oh.make_tensor_value_info("stacked", T.FLOAT, [3, "N", 2]),
            oh.make_tensor_value_info("cat", T.FLOAT, ["N", 6]),
            oh.make_value_info("triple", seq_out),
        ],
        [
            onh.from_array(np.array([2, 2, 2], np.int64), "two"),
            onh.from_array(np.array(0, np.int64), "zero"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=6)
    onnx.checker.check_model(model)
    onnx.save(model, str(work / "sequences.onnx"))
    return work / "sequences.onnx"


@form("keras2onnx-style: PRelu slopes [C,1,1], variadic Sum/Max/Mean, LeakyRelu (opset 9)")
def _keras_ops(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y, float[N, 8, 8, 8] z) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            p = PRelu(c, slope)
            l = LeakyRelu <alpha = 0.2> (c)
            s = Sum(p, l, c)
            y = Max(s, l, p)
            z = Mean(p, l)
        }
        """,
        work / "keras_ops.onnx",
        w=_rand(8, 3, 3, 3),
        b=_rand(8),
        slope=np.abs(_rand(8, 1, 1)),
    )


# ---------------------------------------------------------------- zoo-era corner cases


@form("BatchNormalization-7 listing its 5 statistics outputs (training mode), Conv (opset 7)")
def _bn7_training(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 3, opset_import: ["" : 7]>
        g (float[2, 3, 8, 8] x) => (float[2, 8, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            n, m1, v1, sm, sv = BatchNormalization <epsilon = 0.00001> (c, g, be, mu, var)
            y = Relu(n)
        }
        """,
        work / "bn7_training.onnx",
        **_conv(),
        **_bn(),
    )


@form("BatchNormalization-9 with empty trailing output names (y, '', '', '', '')")
def _bn_empty_outputs(base: Path, work: Path) -> Path:
    path = _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            n = BatchNormalization <epsilon = 0.00001> (c, g, be, mu, var)
            y = Relu(n)
        }
        """,
        work / "bn_empty_outputs.onnx",
        **_conv(),
        **_bn(),
    )
    model = onnx.load(str(path))
    model.graph.node[1].output.extend([""] * 4)
    onnx.save(model, str(path))
    return path


@form("Pad-2 before AveragePool / MaxPool (-3.4e38), MaxPool indices to MaxUnpool (opset 9)")
def _pad_pools(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x) => (float[N, 3, 8, 8] y, float[N, 3, 8, 8] z, float[N, 3, 8, 8] u) {
            p = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1]> (x)
            y = AveragePool <kernel_shape = [3, 3]> (p)
            q = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], value = -3.4e38> (x)
            z = MaxPool <kernel_shape = [3, 3]> (q)
            m, i = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
            r = Relu(m)
            u = MaxUnpool <kernel_shape = [2, 2], strides = [2, 2]> (r, i)
        }
        """,
        work / "pad_pools.onnx",
    )


@form("Conv auto_pad SAME_UPPER/SAME_LOWER after Pad-2, ConvTranspose + BN (opset 9)")
def _auto_pad(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 7, 7] x) => (float[N, 8, 4, 4] y, float[N, 8, 4, 4] z, float[N, 4, 9, 9] t) {
            p = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1]> (x)
            c = Conv <auto_pad = "SAME_UPPER", strides = [2, 2]> (p, w, b)
            n = BatchNormalization (c, g, be, mu, var)
            y = Relu(n)
            d = Conv <auto_pad = "SAME_LOWER", strides = [2, 2], kernel_shape = [3, 3]> (x, w2)
            z = Sigmoid(d)
            ct = ConvTranspose <strides = [2, 2]> (y, wt, bt)
            t = Relu(ct)
        }
        """,
        work / "auto_pad.onnx",
        **_conv(),
        **_bn(),
        w2=_rand(8, 3, 3, 3, seed=5),
        wt=_rand(8, 4, 3, 3),
        bt=_rand(4),
    )


@form("keras2onnx BN as Mul+Add after Conv, MatMul+Add in int32 and double (opset 7/9)")
def _keras_affine(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 3, 8, 8] x, int32[N, 4] i, double[N, 4] d) => (float[N, 8, 8, 8] y, int32[N, 5] j,
                                                                   double[N, 5] e) {
            c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            m = Mul(c, s)
            a = Add(m, t)
            y = Relu(a)
            mi = MatMul(i, wi)
            j = Add(mi, bi)
            md = MatMul(d, wd)
            e = Add(md, bd)
        }
        """,
        work / "keras_affine.onnx",
        **_conv(),
        s=_rand(8, 1, 1) + 1.0,
        t=_rand(8, 1, 1, seed=4),
        wi=np.arange(20, dtype=np.int32).reshape(4, 5),
        bi=np.arange(5, dtype=np.int32),
        wd=_rand(4, 5).astype(np.float64),
        bd=_rand(5).astype(np.float64),
    )


@form("opset-9 ops: ConstantOfShape, Where, OneHot, Erf, Scatter, Compress, Squeeze without axes")
def _opset9_ops(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 4, opset_import: ["" : 9]>
        g (float[N, 4] x, int64[N] lab) => (float[N, 4] a, float[N, 10] hot, float[N, 4] e,
                                            float[N, 4] sc, float[K] cp, float[M] sq) {
            shape = Shape(x)
            z = ConstantOfShape <value = float[1] {1.5}> (shape)
            pos = Greater(x, zero)
            a = Where(pos, x, z)
            depth = Constant <value = int64[1] {10}> ()
            vals = Constant <value = float[2] {0.0, 1.0}> ()
            hot = OneHot <axis = -1> (lab, depth, vals)
            e = Erf(x)
            idx = Constant <value = int64[1, 2] {0, 3}> ()
            upd = Constant <value = float[1, 2] {9.0, 8.0}> ()
            x1 = Slice <starts = [0], ends = [1], axes = [0]> (x)
            sc0 = Scatter <axis = 1> (x1, idx, upd)
            sc = Add(x, sc0)
            flat = Flatten <axis = 0> (x)
            fl = Squeeze <axes = [0]> (flat)
            m = Greater(fl, zero)
            cp = Compress <axis = 0> (fl, m)
            x2 = Slice <starts = [0], ends = [1], axes = [1]> (x)
            sq = Squeeze(x2)
        }
        """,
        work / "opset9_ops.onnx",
        zero=np.array(0.0, np.float32),
    )


@form("Slice-10 steps (stride 2, reversed), If-11 branches of different shapes")
def _slice_steps(base: Path, work: Path) -> Path:
    return _text(
        """
        <ir_version: 6, opset_import: ["" : 11]>
        g (float[N, 3, 8, 8] x) => (float[N, 3, 4, 8] y, float[N, 3, 8, 8] z, float[M, 3, 8, 8] w) {
            y = Slice(x, zero, big, two, two)
            z = Slice(x, minus1, minus_big, three, minus1)
            s = ReduceSum <keepdims = 0> (x)
            c = Greater(s, fzero)
            w = If (c) <then_branch = t () => (float[N, 3, 8, 8] a) { a = Relu(x) },
                        else_branch = e () => (float[K, 3, 8, 8] b) { b = Concat <axis = 0> (x, x) }>
        }
        """,
        work / "slice_steps.onnx",
        zero=np.array([0], np.int64),
        big=np.array([2**63 - 1], np.int64),
        two=np.array([2], np.int64),
        three=np.array([3], np.int64),
        minus1=np.array([-1], np.int64),
        minus_big=np.array([-(2**63) + 1], np.int64),
        fzero=np.array(0.0, np.float32),
    )


# ---------------------------------------------------------------- skl2onnx


def _sklearn(model: object, x: np.ndarray, path: Path, default: bool, **options: object) -> Path:
    """skl2onnx's conversion at its default opsets (the oldest the model needs: often 9) or at 15
    (which writes some models with the default domain imported twice)."""
    from skl2onnx import to_onnx

    opsets = None if default else {"": 15, "ai.onnx.ml": 3}
    proto = to_onnx(model, x[:1], target_opset=opsets, **options)  # type: ignore[arg-type]
    onnx.save(proto, str(path))
    return path


def _iris() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.8)
    return x, y


_SKLEARN = (
    ("LogisticRegression", False),
    ("LogisticRegression", True),
    ("RandomForestClassifier", False),
    ("GradientBoostingClassifier", False),
    ("SVC", False),
    ("KMeans", False),
    ("MLPClassifier", False),
    ("Pipeline(StandardScaler, PCA, LogisticRegression)", False),
    ("LogisticRegression string labels", False),
    ("LogisticRegression string labels", True),
    ("LogisticRegression default target_opset", False),
    ("RandomForestClassifier default target_opset", False),
    ("RandomForestRegressor", False),
    ("LinearRegression", False),
    ("RandomForestClassifier", True),
    ("SVC", True),
    ("KNeighborsClassifier", True),
    ("IsolationForest", False),
    ("GaussianProcessRegressor", False),
)


def _estimator(kind: str) -> object:
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        IsolationForest,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    return {
        "LogisticRegression": lambda: LogisticRegression(max_iter=200),
        "RandomForestClassifier": lambda: RandomForestClassifier(4, max_depth=3, random_state=0),
        "GradientBoostingClassifier": lambda: GradientBoostingClassifier(
            n_estimators=4, max_depth=2, random_state=0
        ),
        "SVC": lambda: SVC(probability=True, random_state=0),
        "KMeans": lambda: KMeans(3, n_init=2, random_state=0),
        "MLPClassifier": lambda: MLPClassifier((8,), max_iter=50, random_state=0),
        "Pipeline(StandardScaler, PCA, LogisticRegression)": lambda: make_pipeline(
            StandardScaler(), PCA(3), LogisticRegression()
        ),
        "RandomForestRegressor": lambda: RandomForestRegressor(4, max_depth=3, random_state=0),
        "LinearRegression": LinearRegression,
        "KNeighborsClassifier": lambda: KNeighborsClassifier(5),
        "IsolationForest": lambda: IsolationForest(n_estimators=8, random_state=0),
        "GaussianProcessRegressor": GaussianProcessRegressor,
    }[kind]()


for _kind, _zipmap in _SKLEARN:

    def _skl(base: Path, work: Path, kind: str = _kind, zipmap: bool = _zipmap) -> Path:
        import warnings

        x, y = _iris()
        labels: np.ndarray = (
            np.array(["setosa", "versicolor", "virginica"])[y] if "string" in kind else y
        )
        default = kind.endswith(" default target_opset")
        estimator = _estimator(
            kind.removesuffix(" string labels").removesuffix(" default target_opset")
        )
        regression = kind.endswith("Regressor") or kind == "LinearRegression"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if regression:
                estimator.fit(x, x[:, 0] * 2 + x[:, 1])  # type: ignore[attr-defined]
            else:
                estimator.fit(x, labels)  # type: ignore[attr-defined]
        unsupervised = kind in ("KMeans", "IsolationForest")  # no class scores: no ZipMap
        options = {} if zipmap or regression or unsupervised else {"zipmap": False}
        path = (
            work / f"skl_{kind.split('(')[0].replace(' ', '_')}{'_zipmap' if zipmap else ''}.onnx"
        )
        return _sklearn(
            estimator, x, path, default, options={id(estimator): options} if options else None
        )

    form(f"skl2onnx {_kind}{' with ZipMap' if _zipmap else ''}")(_skl)


# ---------------------------------------------------------------- TorchScript exporter, old opsets


def _torch_export(module: object, example: tuple, path: Path, opset: int, **axes: dict) -> Path:
    import torch

    torch.onnx.export(
        module,  # type: ignore[arg-type]
        example,
        str(path),
        opset_version=opset,
        dynamo=False,
        input_names=[f"in{i}" for i in range(len(example))],
        dynamic_axes=axes or None,
    )
    return path


def _small_cnn() -> object:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU6(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),
        torch.nn.Hardtanh(-1.0, 1.0),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(8, 4),
        torch.nn.LogSoftmax(dim=1),
    ).eval()


class _Recurrent:
    """An LSTM and a GRU over a sequence, batch-first, with a linear head (built lazily: torch)."""

    @staticmethod
    def build() -> object:
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = torch.nn.LSTM(4, 8, num_layers=2, batch_first=True)
                self.gru = torch.nn.GRU(8, 6, bidirectional=True, batch_first=True)
                self.head = torch.nn.Linear(12, 3)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                h, _ = self.lstm(x)
                g, _ = self.gru(h)
                return self.head(g[:, -1])

        torch.manual_seed(0)
        return Net().eval()


for _opset in (9, 11):

    def _cnn(base: Path, work: Path, opset: int = _opset) -> Path:
        import torch

        return _torch_export(
            _small_cnn(),
            (torch.randn(2, 3, 16, 16),),
            work / f"cnn_ts{opset}.onnx",
            opset,
            in0={0: "batch", 2: "h", 3: "w"},
        )

    def _rnn(base: Path, work: Path, opset: int = _opset) -> Path:
        import torch

        return _torch_export(
            _Recurrent.build(),
            (torch.randn(2, 5, 4),),
            work / f"rnn_ts{opset}.onnx",
            opset,
            in0={0: "batch", 1: "seq"},
        )

    form(f"torch.onnx.export(dynamo=False) CNN BN/ReLU6/Hardtanh at opset {_opset}")(_cnn)
    form(f"torch.onnx.export(dynamo=False) LSTM+GRU at opset {_opset}")(_rnn)


if __name__ == "__main__":
    sys.exit(main(FORMS, _nothing, __doc__.splitlines()[0]))
