"""Every public name of the device runtime (``pycudnn.handle``, ``pycudnn.memory``) imports from
its documented path, and the re-exports are the objects of the modules that define them."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

HANDLE_NAMES = [
    "CudaError",
    "CudaUnavailableError",
    "DeviceContext",
    "Handle",
    "coerce_stream",
    "current_device",
    "device_count",
    "get_handle",
    "gpu_unavailable_reason",
    "require_gpu",
    "WorkspaceScope",
    "workspace_scope",
]
MEMORY_NAMES = [
    "DeviceArray",
    "NotDeviceMemoryError",
    "asarray",
    "cache_stats",
    "check_alignment",
    "check_device_pointer",
    "empty",
    "empty_cache",
    "empty_like",
    "get_cache_limit",
    "get_workspace",
    "mem_get_info",
    "release_workspace",
    "set_cache_limit",
    "to_device",
    "workspace_size",
    "zeros",
]
# where each name is defined (the documented path re-exports that very object)
HOMES = {
    "CudaError": "pycudnn.errors",
    "CudaUnavailableError": "pycudnn.errors",
    "NotDeviceMemoryError": "pycudnn.errors",
    "DeviceContext": "pycudnn._cuda",
    "coerce_stream": "pycudnn._cuda",
    "current_device": "pycudnn._cuda",
    "device_count": "pycudnn._cuda",
    "gpu_unavailable_reason": "pycudnn._cuda",
    "require_gpu": "pycudnn._cuda",
    "mem_get_info": "pycudnn._cuda",
    "DeviceArray": "pycudnn.memory.array",
    "empty": "pycudnn.memory.array",
    "zeros": "pycudnn.memory.array",
    "empty_like": "pycudnn.memory.array",
    "to_device": "pycudnn.memory.array",
    "asarray": "pycudnn.memory.interop",
    "check_alignment": "pycudnn.memory.interop",
    "check_device_pointer": "pycudnn.memory.interop",
    "cache_stats": "pycudnn.memory.allocator",
    "empty_cache": "pycudnn.memory.allocator",
    "get_cache_limit": "pycudnn.memory.allocator",
    "set_cache_limit": "pycudnn.memory.allocator",
    "get_workspace": "pycudnn.memory.allocator",
    "workspace_size": "pycudnn.memory.allocator",
    "release_workspace": "pycudnn.memory.allocator",
}


@pytest.mark.parametrize(
    ("module", "name"),
    [("pycudnn.handle", n) for n in HANDLE_NAMES] + [("pycudnn.memory", n) for n in MEMORY_NAMES],
)
def test_documented_path_imports(module, name):
    code = f"from {module} import {name}"
    exec(compile(code, "<documented path>", "exec"), {})
    obj = getattr(importlib.import_module(module), name)
    home = HOMES.get(name)
    if home is not None:
        assert obj is getattr(importlib.import_module(home), name)


def test_all_lists_exactly_the_documented_names():
    assert sorted(importlib.import_module("pycudnn.handle").__all__) == sorted(HANDLE_NAMES)
    assert sorted(importlib.import_module("pycudnn.memory").__all__) == sorted(MEMORY_NAMES)


def test_top_level_names_are_the_same_objects():
    import pycudnn
    from pycudnn import handle, memory

    for name in ("DeviceArray", "to_device", "empty", "zeros", "asarray"):
        assert getattr(pycudnn, name) is getattr(memory, name)
    assert pycudnn.Handle is handle.Handle and pycudnn.get_handle is handle.get_handle
    assert memory.DEFAULT_CACHE_LIMIT == 1 << 30  # documented constant


def test_the_allocator_interface_is_importable():
    from pycudnn.memory.allocator import (
        Allocation,
        Block,
        CachingAllocator,
        MemoryResource,
        memory_resource,
        set_memory_resource,
    )

    cache = memory_resource()
    assert isinstance(cache, CachingAllocator) and isinstance(cache, MemoryResource)
    assert callable(Allocation) and Block is not None
    with pytest.raises(TypeError, match="allocate"):
        set_memory_resource(object())
    assert set_memory_resource(None) is cache and memory_resource() is cache


def test_workspace_methods_live_on_the_handle():
    from pycudnn.handle import Handle

    for method in ("workspace", "workspace_size", "release_workspace"):
        assert callable(getattr(Handle, method))


def test_dead_surface_is_gone():
    from pycudnn import memory

    for name in ("check_operand", "pointer_alignment"):
        assert not hasattr(memory, name)


def test_the_memory_package_does_not_import_the_handle():
    code = (
        "import sys, pycudnn.memory;"
        "assert 'pycudnn.handle' not in sys.modules, 'memory imported handle';"
        "assert 'pycudnn.descriptors' not in sys.modules;"
        "assert 'pycudnn.highlevel' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
