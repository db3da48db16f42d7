"""This interpreter's llama.cpp build: what it supports, its devices, and llama.cpp RPC servers."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from pathlib import Path
from typing import Any, Sequence

import llama_cpp as lc

from ...errors import EngineError


def _ggml_lib() -> ctypes.CDLL | None:
    """The ggml library this llama-cpp-python build loaded (for the device registry)."""
    lib_dir = Path(lc.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            try:
                return ctypes.CDLL(str(lib_dir / name))
            except OSError:
                return None
    return None


def backend_report() -> dict[str, Any]:
    """This interpreter's llama-cpp-python build: versions, CPU features, GPU/RPC support, devices."""
    devices = []
    lib = _ggml_lib()
    if lib is not None and hasattr(lib, "ggml_backend_dev_count"):
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            devices.append({"name": lib.ggml_backend_dev_name(dev).decode(),
                            "description": lib.ggml_backend_dev_description(dev).decode(),
                            "memory_free": free.value, "memory_total": total.value})
    return {
        "python": sys.executable,
        "llama_cpp_python": lc.__version__,
        "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(" |"),
        "gpu_offload": bool(lc.llama_supports_gpu_offload()),
        "rpc": bool(lc.llama_supports_rpc()),
        "mmap": bool(lc.llama_supports_mmap()),
        "extra_buffers": extra_buffers_allowed(),
        "amx_kernels": has_amx_kernels(),
        "devices": devices,
    }


@functools.cache  # (reads /proc/cpuinfo: once per process, not once per cache key)
def build_id() -> str:
    """This build and machine, for cache keys: llama-cpp-python's version, ggml's CPU features, the CPU."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = lc.llama_print_system_info().decode("utf-8", errors="replace").strip(" |")
    return f"{lc.__version__} | {info} | {cpu} | {os.cpu_count()} cores"


AMX_OPT_IN = "SPECDEC_LLAMA_AMX"  # set to 1 to let llama.cpp use its AMX kernels anyway


def has_amx_kernels() -> bool:
    """Whether this build compiled llama.cpp's AMX matrix kernels (Intel Sapphire Rapids and later)."""
    return "AMX_INT8 = 1" in lc.llama_print_system_info().decode("utf-8", errors="replace")


def extra_buffers_allowed() -> bool:
    """Whether llama.cpp may keep weights in its extra buffer layouts (repacked for its CPU GEMM
    kernels, or for AMX). Not in a build with AMX kernels: on some machines they crash in the
    first batched pass (llama.cpp issue 20824; seen here on a 2-core Sapphire Rapids VM, Gemma
    3 and every quantized tiny model), so they stay off unless ``SPECDEC_LLAMA_AMX=1``. Plain
    and speculative decoding then use the same kernels; only speed can differ."""
    return not has_amx_kernels() or os.environ.get(AMX_OPT_IN, "") == "1"


def device_list(names: Sequence[str]) -> ctypes.Array:
    """A NULL-terminated array of ggml device handles for ``llama_model_params.devices``."""
    lib = _ggml_lib()
    if lib is None:
        raise EngineError("cannot open this build's ggml library to select devices")
    lib.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    handles = []
    for name in names:
        handle = lib.ggml_backend_dev_by_name(name.encode())
        if not handle:
            known = ", ".join(d["name"] for d in backend_report()["devices"])
            raise EngineError(f"device {name!r} is not in this build (devices: {known})")
        handles.append(handle)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def add_rpc_servers(servers: Sequence[str]) -> None:
    """Register llama.cpp RPC servers (``host:port``) as devices, as llama.cpp's ``--rpc`` does.

    Needs a build with GGML_RPC=on; raises EngineError naming what is missing otherwise.
    """
    if not servers:
        return
    if not lc.llama_supports_rpc():
        raise EngineError("this llama-cpp-python build has no RPC backend; rebuild it with "
                          "CMAKE_ARGS='-DGGML_RPC=on' pip install --force-reinstall llama-cpp-python")
    lib = _ggml_lib()
    if lib is None:
        raise EngineError("cannot open this build's ggml library to register RPC servers")
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not add:
        raise EngineError("the RPC backend does not offer ggml_backend_rpc_add_server (llama.cpp too old?)")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for server in servers:
        server_reg = add_server(server.encode())
        if not server_reg:
            raise EngineError(f"cannot connect to RPC server {server!r}")
        lib.ggml_backend_register(server_reg)
