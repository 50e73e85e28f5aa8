"""Text generation tensors as Triton's vLLM backend names them, to and from an OpenAI completions body.

Inputs (one element each): `text_input` (BYTES, the prompt), `stream` (BOOL), `sampling_parameters`
(BYTES, a JSON object of completions fields: `max_tokens`, `temperature`, `top_p`, `seed`, `stop`, ...;
numbers may be sent as strings, as the vLLM backend accepts them), `exclude_input_in_output` (BOOL).
Output: `text_output` (BYTES). A completions answer never echoes the prompt, so unless
`exclude_input_in_output` is true the prompt is put in front of the text here, as the vLLM backend does.
Contents come raw (`raw_input_contents`, as tritonclient sends them) or in the typed fields.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from proxy.errors import ApiError
from proxy.grpc.protocol import grpc_service_pb2 as pb

TEXT_INPUT: Final = "text_input"
STREAM: Final = "stream"
SAMPLING_PARAMETERS: Final = "sampling_parameters"
EXCLUDE_INPUT_IN_OUTPUT: Final = "exclude_input_in_output"
TEXT_OUTPUT: Final = "text_output"
BYTES: Final = "BYTES"
BOOL: Final = "BOOL"

INPUT_DATATYPES: Final = {
    TEXT_INPUT: BYTES,
    STREAM: BOOL,
    SAMPLING_PARAMETERS: BYTES,
    EXCLUDE_INPUT_IN_OUTPUT: BOOL,
}
"""Every input the front door reads, with its datatype (ModelMetadata lists them in this order)."""

_INT_FIELDS: Final = frozenset({"max_tokens", "n", "seed", "top_k", "logprobs"})
_FLOAT_FIELDS: Final = frozenset(
    {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
)
_RESERVED_FIELDS: Final = frozenset({"model", "prompt", "stream", "stream_options", "echo"})
"""Fields the tensors themselves decide; `sampling_parameters` may not set them."""
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class TextRequest:
    """What one ModelInferRequest asks for."""

    text: str
    stream: bool
    exclude_input: bool
    sampling: dict[str, Any]

    def completions_body(self, model: str) -> bytes:
        """The OpenAI completions request the pipeline serves for this request."""
        body = {**self.sampling, "model": model, "prompt": self.text, "stream": self.stream}
        return msgspec.json.encode(body)


class _Choice(msgspec.Struct):
    text: str = ""
    finish_reason: str | None = None


class _Answer(msgspec.Struct):
    """The fields read from a completions body or a stream chunk."""

    choices: list[_Choice] = msgspec.field(default_factory=list)


_answer_decoder = msgspec.json.Decoder(_Answer)


def read_text_request(request: pb.ModelInferRequest) -> TextRequest:
    """The request's tensors; 400 (`INVALID_ARGUMENT`) naming the tensor that is missing or malformed."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise _invalid("raw_input_contents", "needs one entry per input tensor")
    values: dict[str, bytes | bool] = {}
    for position, tensor in enumerate(request.inputs):
        expected = INPUT_DATATYPES.get(tensor.name)
        if expected is None:
            raise _invalid(
                tensor.name, f"is not an input of this model; inputs: {', '.join(INPUT_DATATYPES)}"
            )
        if tensor.datatype != expected:
            raise _invalid(tensor.name, f"must have datatype {expected}, not {tensor.datatype or 'none'}")
        if _element_count(tensor.shape) != 1:
            raise _invalid(tensor.name, "must hold exactly one element (shape [1])")
        content = raw[position] if raw else None
        values[tensor.name] = _one_bytes(tensor, content) if expected == BYTES else _one_bool(tensor, content)
    text = values.get(TEXT_INPUT)
    if not isinstance(text, bytes):
        raise _invalid(TEXT_INPUT, "is required")
    sampling = values.get(SAMPLING_PARAMETERS)
    return TextRequest(
        text=_utf8(TEXT_INPUT, text),
        stream=values.get(STREAM) is True,
        exclude_input=values.get(EXCLUDE_INPUT_IN_OUTPUT) is True,
        sampling=_sampling(sampling) if isinstance(sampling, bytes) else {},
    )


def answer_text(body: bytes) -> str:
    """The text of a whole completions answer (one choice)."""
    choices = _answer_decoder.decode(body).choices
    return choices[0].text if choices else ""


def chunk_text(payload: bytes) -> tuple[str, bool]:
    """The text of one stream chunk, and whether it finishes the choice."""
    choices = _answer_decoder.decode(payload).choices
    if not choices:
        return "", False  # the usage chunk
    return choices[0].text, choices[0].finish_reason is not None


def text_output(text: str) -> pb.ModelInferResponse.InferOutputTensor:
    """The `text_output` tensor holding `text` (one element, in the typed contents)."""
    return pb.ModelInferResponse.InferOutputTensor(
        name=TEXT_OUTPUT,
        datatype=BYTES,
        shape=[1],
        contents=pb.InferTensorContents(bytes_contents=[text.encode()]),
    )


def _element_count(shape: Any) -> int:
    count = 1
    for dimension in shape:
        count *= dimension
    return count


def _one_bytes(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> bytes:
    if raw is None:
        items = tensor.contents.bytes_contents
        if len(items) != 1:
            raise _invalid(tensor.name, "must hold exactly one element in bytes_contents")
        return bytes(items[0])
    # Raw BYTES: each element is a 4-byte little-endian length, then that many bytes.
    if len(raw) < _LENGTH.size or _LENGTH.unpack_from(raw)[0] != len(raw) - _LENGTH.size:
        raise _invalid(tensor.name, "has raw contents that are not one length-prefixed BYTES element")
    return raw[_LENGTH.size :]


def _one_bool(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> bool:
    if raw is None:
        items = tensor.contents.bool_contents
        if len(items) != 1:
            raise _invalid(tensor.name, "must hold exactly one element in bool_contents")
        return bool(items[0])
    if len(raw) != 1:
        raise _invalid(tensor.name, "has raw contents that are not one BOOL byte")
    return raw != b"\x00"


def _utf8(name: str, value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise _invalid(name, "is not UTF-8 text") from None


def _sampling(value: bytes) -> dict[str, Any]:
    """The JSON object of completions fields, numbers given as strings converted."""
    try:
        fields = msgspec.json.decode(value)
    except msgspec.DecodeError as exc:
        raise _invalid(SAMPLING_PARAMETERS, f"is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise _invalid(SAMPLING_PARAMETERS, "must be a JSON object")
    if reserved := sorted(_RESERVED_FIELDS & fields.keys()):
        raise _invalid(SAMPLING_PARAMETERS, f"may not set {', '.join(reserved)} (the tensors decide them)")
    if fields.get("n", 1) not in (1, "1"):
        raise _invalid(SAMPLING_PARAMETERS, "n must be 1: text_output holds one choice")
    for name, field in fields.items():
        if isinstance(field, str) and (name in _INT_FIELDS or name in _FLOAT_FIELDS):
            fields[name] = _number(name, field)
    return fields


def _number(name: str, text: str) -> int | float:
    try:
        return int(text) if name in _INT_FIELDS else float(text)
    except ValueError:
        raise _invalid(SAMPLING_PARAMETERS, f"{name} is not a number: {text!r}") from None


def _invalid(tensor: str, problem: str) -> ApiError:
    return ApiError(400, f"Input tensor `{tensor}` {problem}.", param=tensor, code="invalid_tensor")
