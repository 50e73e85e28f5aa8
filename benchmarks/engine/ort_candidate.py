"""onnxruntime's `MatMulNBits` (MLAS's blockwise int4 kernels) as a product candidate for `products`.

Not a dependency: measured when `onnxruntime` and `onnx` are installed
(`.venv/bin/pip install onnxruntime onnx`). Each matrix is a session of one `MatMulNBits` node
(groups of 32, `accuracy_level` 4: rows quantized to int8 per group, as llama.cpp's Q8_1), run once
per product as the engine would have to call it between torch's ops. Its default zero point (8)
gives `scale * (q - 8)`, the benchmark's Q4_1 parts exactly; a real Q4_1 offset would need a second
product on the rows' group sums.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

GROUP_SIZE = 32
Product = Callable[[torch.Tensor], torch.Tensor]


def available() -> bool:
    """Whether onnxruntime and onnx are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def matmul_nbits(q: torch.Tensor, scale: torch.Tensor, threads: int) -> Product:
    """A product `x @ (scale * (q - 8)).T` for `x` [rows, k] fp32: `q` [n, k] in 0..15, `scale` [n, k/32]."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n, k = q.shape
    nibbles = q.view(n, k // GROUP_SIZE, GROUP_SIZE // 2, 2)
    packed = (nibbles[..., 0] | (nibbles[..., 1] << 4)).numpy()  # element 2i low, 2i + 1 high
    node = helper.make_node(
        "MatMulNBits",
        ["x", "b", "scales"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=GROUP_SIZE,
        accuracy_level=4,
    )
    graph = helper.make_graph(
        [node],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [
            numpy_helper.from_array(np.ascontiguousarray(packed), "b"),
            numpy_helper.from_array(scale.contiguous().numpy().reshape(-1), "scales"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # A spinning pool per session starves the others (and torch's): 1.0-1.9 s for 120 products.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def product(x: torch.Tensor) -> torch.Tensor:
        # `run` on numpy views: 16 us a call here, against 98 us through `run_with_iobinding`.
        return torch.from_numpy(session.run(None, {"x": x.numpy()})[0])

    return product
