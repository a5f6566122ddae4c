"""An independent reader of safetensors files and Hugging Face checkpoint folders.

Written from the file format alone (8-byte little-endian header length, JSON header with dtype,
shape and data_offsets per tensor, then the data) with json, struct and numpy, so tests can read
what fp8rl writes without using fp8rl's own reader. Decodes F32, F16, BF16 and F8_E4M3 (OCP: bias
7, subnormals m/8 * 2^-6, S.1111.111 NaN) to float32/float64 arrays.
"""
import json
import os
import struct

import numpy as np

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4,
              "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class FormatError(Exception):
    pass


def read_file(path):
    """Returns ({name: (dtype, shape, bytes)}, metadata) after checking the header's invariants."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: shorter than the header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise FormatError(f"{path}: header length {n} past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors, spans = {}, []
    for name, e in header.items():
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if end - begin != count * DTYPE_SIZE[e["dtype"]] or end > len(data):
            raise FormatError(f"{path}: {name}: offsets [{begin}, {end}) do not match its shape")
        spans.append((begin, end))
        tensors[name] = (e["dtype"], list(e["shape"]), data[begin:end])
    spans.sort()
    for (b0, e0), (b1, _) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: overlapping tensors")
    return tensors, metadata


def read_checkpoint(folder):
    """All tensors of a folder (model.safetensors, or the shards named by the index).

    Returns ({name: (dtype, shape, bytes)}, {name: shard file name}, index or None)."""
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        tensors, _ = read_file(single)
        return tensors, {n: "model.safetensors" for n in tensors}, None
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    tensors, where = {}, {}
    for shard in sorted(set(index["weight_map"].values())):
        part, _ = read_file(os.path.join(folder, shard))
        for name, t in part.items():
            if name in tensors:
                raise FormatError(f"{folder}: tensor {name} in two shards")
            tensors[name] = t
            where[name] = shard
    return tensors, where, index


def e4m3_to_f64(codes):
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return sign * np.where((e == 15) & (m == 7), np.nan, mag)


def decode(dtype, shape, raw):
    """A float tensor as a numpy array (float32; float64 for F8_E4M3 codes' values)."""
    if dtype == "F32":
        x = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        x = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F8_E4M3":
        x = e4m3_to_f64(np.frombuffer(raw, dtype=np.uint8))
    else:
        raise FormatError(f"not a float dtype: {dtype}")
    return x.reshape(shape)


def round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), as float32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    return (bits << 16).view(np.float32)
